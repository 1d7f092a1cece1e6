"""What vLLM's argument parser (`FlexibleArgumentParser`, vllm/utils/argparse_utils.py in
0.33.0) does to a `vllm serve` command line before parsing it, done here for
`doppelchip vllm serve`: `--config FILE.yaml` expands into the flags the file holds,
`--max_model_len` is `--max-model-len`, `-O3` is `--optimization-level 3`, and dotted
arguments (`-cc.cudagraph_mode FULL`, `--compilation-config.mode=3`) merge into their flag's
JSON.

Why a module of its own: manifests keep their flags in a YAML file (`vllm serve --config
/etc/vllm/config.yaml`), and this is the one step between `doppelchip vllm` and argparse.
"""

from __future__ import annotations

import json
from argparse import ArgumentTypeError
from typing import Any


def vllm_argv(argv: list[str], negatable: set[str]) -> list[str]:
    """`argv` (starting with "vllm") with vLLM's rewrites; `negatable` holds the flags that
    have a `--no-` form. ValueError names a bad `--config`."""
    argv = _dotted(_optimization([_dashes(a) for a in argv]))
    if "--config" not in argv:
        return argv
    if argv.count("--config") > 1:
        raise ValueError("More than one config file specified!")
    at = argv.index("--config")
    if at == len(argv) - 1:
        raise ValueError("No config file specified! Please check your command-line arguments.")
    from_file = config_args(argv[at + 1], negatable)
    rest = argv[:at] + argv[at + 2:]
    if rest[1:2] != ["serve"]:  # `vllm --config F serve`: only `serve` exists here
        return rest[:1] + from_file + rest[1:]
    model_in_cli = len(rest) > 2 and not rest[2].startswith("-")
    if not model_in_cli and "--model" not in from_file:
        raise ValueError("No model specified! Please specify model either as a positional "
                         "argument or in a config file.")
    head = 3 if model_in_cli else 2  # cli > config > defaults, as vLLM orders them
    return rest[:head] + from_file + rest[head:]


def config_args(path: str, negatable: set[str]) -> list[str]:
    """A YAML file's keys as flags, by vLLM's rules: true is `--key`, false `--no-key` where
    the flag has one, a list `--key item ...`, a mapping its JSON."""
    import yaml

    if path.split(".")[-1] not in ("yaml", "yml"):
        raise ValueError(f"Config file must be of a yaml/yml type. {path.split('.')[-1]} "
                         "supplied")
    try:
        with open(path) as f:
            doc: Any = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"cannot read the config file {path}: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"config file {path}: expected a mapping of flag names to values")
    out: list[str] = []
    for key, value in doc.items():
        flag = _dashes(f"--{key}")
        if isinstance(value, bool):
            if value:
                out.append(flag)
            elif f"--no-{flag[2:]}" in negatable:
                out.append(f"--no-{flag[2:]}")
        elif isinstance(value, list):
            if value:
                out += [flag, *map(str, value)]
        elif isinstance(value, dict):
            out += [flag, json.dumps(value)]
        else:
            out += [flag, str(value)]
    return out


def _dashes(arg: str) -> str:
    """vLLM reads `--max_model_len[=V]` as `--max-model-len[=V]` (a dotted argument's field
    names keep their underscores: `--compilation-config.pass_config.x`)."""
    if not arg.startswith("--"):
        return arg
    key, eq, value = arg.partition("=")
    flag, dot, fields = key.partition(".")
    return flag.replace("_", "-") + dot + fields + eq + value


def _optimization(argv: list[str]) -> list[str]:
    """`-O3`, `-O=3` and `-O 3` are `--optimization-level 3`."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg.startswith("-O") and arg != "-O":
            out += ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]]
        elif arg == "-O" and argv[i + 1:i + 2] in (["0"], ["1"], ["2"], ["3"]):
            out.append("--optimization-level")
        else:
            out.append(arg)
    return out


def _dotted(argv: list[str]) -> list[str]:
    """`--flag.key.sub VALUE` (or `=VALUE`; `key+` splits a comma list) sets one field of a
    JSON flag: every dotted argument of one flag merges into one JSON value, appended last,
    a value read as JSON where it parses, else kept as text."""
    from doppelchip.vllm_parser import human_readable_int

    merged: dict[str, dict[str, Any]] = {}
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if not (arg.startswith("-") and "." in name):
            out.append(arg)
            continue
        if "=" in arg:
            value = arg.split("=", 1)[1]
        else:
            if i + 1 >= len(argv):
                raise ValueError(f"{arg}: expected a value")
            value, skip = argv[i + 1], True
        if name.endswith("+"):
            name, value = name[:-1], json.dumps(value.split(","))
        flag, *keys = name.split(".")
        try:
            parsed: Any = json.loads(value)
        except json.JSONDecodeError:
            try:
                parsed = human_readable_int(value)
            except (ValueError, ArgumentTypeError):
                parsed = value
        node = merged.setdefault(flag, {})
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = parsed
    for flag, value in merged.items():
        out += [flag, json.dumps(value)]
    return out
