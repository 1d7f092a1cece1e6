"""What SGLang 0.5.23 does to a launch command line before its argument parser sees it, done
here for `doppelchip sglang serve` / `launch_server`: `sglang serve REPO` is `sglang serve
--model-path REPO` and `--model-type` picks the server (`sglang/cli/serve.py`), and `--config
FILE.yaml` expands into the flags the file holds (`ConfigArgumentMerger`,
`sglang/srt/utils/server_args_config_parser.py`), ahead of the command line's, which win.

Why a module of its own: manifests keep their flags in a YAML file (`sglang serve --config
/etc/sglang/config.yaml`), and this is the one step between `doppelchip sglang` and argparse.
"""

from __future__ import annotations

import json
import os
from typing import Any

from doppelchip.sglang_flags import SGLANG_OPTIONS

MODEL_TYPES = ("auto", "llm", "diffusion")  # sglang serve's built-in backends


def sglang_argv(argv: list[str]) -> list[str]:
    """`argv` (starting with "sglang") with SGLang's rewrites. ValueError with SGLang's words
    for a bad `--model-type` or `--config`."""
    if len(argv) < 2 or argv[1] not in ("serve", "launch_server"):
        return argv
    head, rest = argv[:2], argv[2:]
    if argv[1] == "serve":  # `python -m sglang.launch_server` does neither of these
        rest = _model_type(rest)
        if rest and not rest[0].startswith("-"):
            rest = ["--model-path", *rest]
    if "--config" not in rest:
        return head + rest
    at = [i for i, a in enumerate(rest) if a == "--config"]
    if len(at) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    if at[0] == len(rest) - 1:
        raise ValueError("No config file specified after --config flag!")
    return head + config_args(rest[at[0] + 1]) + rest[:at[0]] + rest[at[0] + 2:]


def _model_type(rest: list[str]) -> list[str]:
    """`rest` without `--model-type NAME`; ValueError unless NAME is the LLM server's."""
    name, out, i = "auto", [], 0
    while i < len(rest):
        if rest[i] == "--model-type":
            if i + 1 >= len(rest):
                raise ValueError("Error: --model-type requires a value.")
            name, i = rest[i + 1], i + 2
            continue
        if rest[i].startswith("--model-type="):
            name = rest[i].split("=", 1)[1]
        else:
            out.append(rest[i])
        i += 1
    if not name:
        raise ValueError("Error: --model-type requires a non-empty value.")
    if name == "diffusion":
        raise ValueError("--model-type diffusion: SGLang's diffusion server is not emulated "
                         "(doppelchip serves language models)")
    if name not in MODEL_TYPES:
        raise ValueError(f"Unknown serve backend {name!r}. Available values: "
                         f"{', '.join(MODEL_TYPES)}.")
    return out


def _keys(flags: tuple[str, ...], dest: str) -> set[str]:
    """The YAML keys that name an option: its dest and each long flag, with underscores."""
    return {dest} | {f[2:].replace("-", "_") for f in flags if f.startswith("--")}


def config_args(path: str) -> list[str]:
    """A YAML file's keys as flags, by SGLang's rules: a store-true switch is `--key` when
    true (nothing when false), any other boolean `--key true|false`, a list `--key item ...`
    (nothing when empty), a mapping its JSON, anything else its text; the key is written as
    given. `--no-X` switches and `--lora-paths` cannot be set from a file, as in SGLang."""
    import yaml

    store_true: set[str] = set()
    unsupported: dict[str, str] = {}
    for o in SGLANG_OPTIONS:
        if o.shape == "switch" and not o.negative:
            store_true |= _keys(o.flags, o.dest)
        elif o.negative or o.name == "--lora-paths":
            kind = "BooleanOptionalAction" if o.negative else "LoRAPathAction"
            unsupported |= dict.fromkeys(_keys(o.flags, o.dest), kind)
    extension = os.path.splitext(path)[1]
    if extension.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {extension}")
    if not os.path.exists(path):
        raise ValueError(f"Config file not found: {path}")
    try:
        with open(path) as f:
            doc: Any = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"Failed to read config file {path}: {e}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    out: list[str] = []
    for key, value in doc.items():
        norm = str(key).replace("-", "_")
        if norm in unsupported and norm not in store_true:
            raise ValueError(f"Unsupported config option '{norm}' with action "
                             f"'{unsupported[norm]}'")
        if isinstance(value, bool):
            if norm not in store_true:
                out += [f"--{key}", str(value).lower()]
            elif value:
                out.append(f"--{key}")
        elif isinstance(value, list):
            if value:
                out += [f"--{key}", *map(str, value)]
        elif isinstance(value, dict):
            out += [f"--{key}", json.dumps(value)]
        else:
            out += [f"--{key}", str(value)]
    return out
