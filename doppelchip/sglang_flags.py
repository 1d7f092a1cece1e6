"""Every `sglang serve` flag, and what `doppelchip sglang serve` does with each.

SGLang 0.5.23's whole command line is `sglang_serve_flags.json`: each option's strings, how
many values it takes, its value type and choices, dumped from SGLang's own parser by
`scripts/sglang_serve_flags.py` (nothing of SGLang's code; docs/SGLANG_SERVE.md, "Every SGLang
flag"). doppelchip/cmd_sglang.py translates the flags whose meaning doppelchip emulates; of the
rest this module says which are accepted silently (they only load, log, bind processes or
tune kernels' launch details: nothing a client or a dashboard sees changes) and which are
refused. Every other SGLang flag is accepted with a start-up warning naming it: it changes
speed, memory or answers in SGLang in a way doppelchip does not emulate, and a manifest still
starts.

Why a module of its own: the lists are data, longer than the code that uses them.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SglangOption:
    """One option of SGLang's `sglang serve` parser, as its command line shapes it.

    `flags`: every string that sets it (`--tp-size`, `--tensor-parallel-size`); `negative`:
    the `--no-X` strings of a switch that set it False; `shape`: 'switch', 'value', 'values'
    (one or more), 'any' (zero or more) or 'optional' (zero or one); `type`: 'int', 'float',
    'human_readable_int' or 'str' (None for a switch)."""

    flags: tuple[str, ...]
    negative: tuple[str, ...]
    shape: str
    dest: str
    type: str | None
    choices: tuple[str, ...] | None

    @property
    def name(self) -> str:
        return self.flags[0]


def _load() -> tuple[str, tuple[SglangOption, ...]]:
    doc = json.loads((Path(__file__).with_name("sglang_serve_flags.json")).read_text())
    return doc["sglang"], tuple(
        SglangOption(tuple(o["flags"]), tuple(o["negative"]), o["shape"], o["dest"], o["type"],
                     tuple(o["choices"]) if o["choices"] else None)
        for o in doc["options"])


SGLANG_VERSION, SGLANG_OPTIONS = _load()
BY_FLAG: dict[str, SglangOption] = {f: o for o in SGLANG_OPTIONS for f in o.flags}


def human_readable_int(value: str) -> int:
    """SGLang's integers (`sglang.srt.utils.common.human_readable_int`): SI suffixes k, M, G, T
    (decimals allowed: '25.6k' is 25,600) and IEC suffixes Ki, Mi, Gi, Ti ('32Ki' is 32,768);
    case-sensitive, so '32K' is an error, as in SGLang."""
    value = value.strip()
    found = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if found:
        number, suffix = found.groups()
        if suffix.endswith("i"):
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. Use an "
                    f"integer IEC value such as '{int(Decimal(number))}{suffix}', or an SI "
                    f"value such as '{number}{suffix[0]}'.")
            return int(number) * 2 ** (10 * "KMGT".index(suffix[0]) + 10)
        return int(Decimal(number) * 10 ** (3 * "kMGT".index(suffix) + 3))
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. Use a plain integer, SI suffixes (1k, 1M), or "
            "IEC suffixes (1Ki, 1Mi). Suffixes are case-sensitive.") from None


TYPES: dict[str | None, Any] = {"int": int, "float": float, "str": str, None: None,
                                "human_readable_int": human_readable_int}
_NARGS = {"value": None, "values": "+", "any": "*", "optional": "?"}


def add_sglang_option(group: Any, name: str, **kwargs: Any) -> None:
    """Register SGLang's option `name` on `group` with every string SGLang accepts for it, its
    shape, type and choices; `kwargs` (help, default, ...) refine it. A switch is None unless
    given (False by its `--no-X` form)."""
    option = BY_FLAG[name]
    extra: dict[str, Any] = {"dest": option.dest}
    if option.shape == "switch":
        positive = [f for f in option.flags if f not in option.negative]
        action = argparse.BooleanOptionalAction if option.negative else "store_true"
        group.add_argument(*positive, action=action, default=None, **{**extra, **kwargs})
        return
    kind = TYPES[option.type]
    extra.update(nargs=_NARGS[option.shape], type=kind)
    if option.choices:
        extra["choices"] = [kind(c) for c in option.choices]
    group.add_argument(*option.flags, **{**extra, **kwargs})


# how SGLang fetches, loads, names or checks weights, logs, traces, binds its processes to
# GPUs, CPUs and ports, or sets HTTP details that no answer shows: nothing is loaded here and
# nothing a client or a dashboard sees changes, so these are accepted without a word
ACCEPTED: tuple[str, ...] = (
    "--tokenizer-path", "--tokenizer-mode", "--tokenizer-backend", "--tokenizer-worker-num",
    "--detokenizer-worker-num", "--load-format", "--model-loader-extra-config",
    "--trust-remote-code", "--revision", "--model-impl", "--download-dir", "--model-checksum",
    "--delete-ckpt-after-loading", "--weight-loader-disable-mmap",
    "--weight-loader-prefetch-checkpoints", "--weight-loader-prefetch-num-threads",
    "--weight-loader-drop-cache-after-load", "--startup-weight-load-mode",
    "--custom-weight-loader", "--skip-server-warmup", "--warmups",
    "--log-level-http", "--log-requests", "--log-requests-level", "--log-requests-format",
    "--log-requests-target", "--uvicorn-access-log-exclude-prefixes", "--show-time-cost",
    "--decode-log-interval", "--crash-dump-folder", "--gc-warning-threshold-secs",
    "--enable-request-time-stats-logging", "--enable-trace", "--trace-modules",
    "--otlp-traces-endpoint", "--otlp-service-name",
    "--device", "--base-gpu-id", "--gpu-id-step", "--nccl-port", "--dist-timeout",
    "--dist-init-addr", "--numa-node", "--gc-threshold", "--watchdog-timeout",
    "--soft-watchdog-timeout", "--enable-p2p-check", "--enable-http-worker-reuseport",
    "--file-storage-path", "--fastapi-root-path",
)

# refused before anything starts (exit status 2), with the reason; `--disaggregation-mode`,
# `--is-embedding`, `--enable-lora`/`--lora-paths` and `--model-type` by value in cmd_sglang
REFUSED: dict[str, str] = {
    "--encoder-only": "an encoder-only server (SGLang's encoder disaggregation) is not "
                      "emulated",
}
