"""Every `vllm serve` flag, and what `doppelchip vllm serve` does with each.

vLLM 0.34.0's whole command line is `vllm_serve_flags.json`: each option's strings, whether
it takes a value, its choices, dumped from vLLM's own parser by `scripts/vllm_serve_flags.py`
(nothing of vLLM's code; docs/VLLM_SERVE.md, "Every vLLM flag"). doppelchip/cmd_vllm.py
translates the flags whose meaning doppelchip emulates; of the rest this module says which
pass through to `doppelchip serve` unchanged, which are accepted silently (they only load,
log or place processes: nothing a client or a dashboard sees changes), and which are refused.
Every other vLLM flag is accepted with a start-up warning naming it: it changes speed,
memory or answers in vLLM in a way doppelchip does not emulate, and a manifest still starts.

Why a module of its own: the lists are data, longer than the code that uses them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class VllmOption:
    """One option of vLLM's `vllm serve` parser, as its command line shapes it.

    `flags`: every string that sets it (aliases and vLLM's `--disable-X` for `--enable-X`
    included); `negative`: those of a switch that set it False; `shape`: 'switch', 'value',
    'values' (one or more), 'optional' (zero or one) or 'append' (repeatable)."""

    flags: tuple[str, ...]
    negative: frozenset[str]
    shape: str
    dest: str
    choices: tuple[str, ...] | None

    @property
    def name(self) -> str:
        return self.flags[0]


def _load() -> tuple[str, tuple[VllmOption, ...]]:
    doc = json.loads((Path(__file__).with_name("vllm_serve_flags.json")).read_text())
    return doc["vllm"], tuple(
        VllmOption(tuple(o["flags"] + o["hidden"]), frozenset(o["negative"]), o["shape"],
                   o["dest"], tuple(o["choices"]) if o["choices"] else None)
        for o in doc["options"])


VLLM_VERSION, VLLM_OPTIONS = _load()
BY_FLAG: dict[str, VllmOption] = {f: o for o in VLLM_OPTIONS for f in o.flags}


class VllmSwitch(argparse.Action):
    """A vLLM switch: True, or False when given as one of its negative strings
    (`--disable-prefix-caching`, `--no-enable-prefix-caching`), as vLLM's
    `EnableDisableAction` and `BooleanOptionalAction` read them."""

    def __init__(self, option_strings: list[str], dest: str, negative: frozenset[str] = frozenset(),
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.negative = negative

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, option_string not in self.negative)


_NARGS = {"value": None, "values": "+", "optional": "?", "append": None}


def add_vllm_option(group: Any, name: str, dest: str | None = None, **kwargs: Any) -> None:
    """Register vLLM's option `name` on `group` with every string vLLM accepts for it and its
    shape; `kwargs` (type, choices, help, ...) refine a value's checks."""
    option = BY_FLAG[name]
    extra: dict[str, Any] = {"dest": dest or option.dest}
    if option.shape == "switch":
        extra.update(action=VllmSwitch, negative=option.negative)
    else:
        extra["nargs"] = _NARGS[option.shape]
        if option.shape == "append":
            extra["action"] = "append"
        if option.choices and "choices" not in kwargs and "type" not in kwargs:
            extra["choices"] = option.choices
    group.add_argument(*option.flags, **{**extra, **kwargs})


# the same name and meaning as `doppelchip serve`'s flag: passed through unchanged (a value's
# type is checked here as serve checks it)
PASSTHROUGH: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--served-model-name", {}),
    ("--data-parallel-size", {"type": int}),
    ("--enable-expert-parallel", {}),
    ("--max-num-seqs", {"type": int}),
    ("--max-num-active-seqs", {"type": int}),
    ("--max-num-queued-reqs", {"type": int}),
    ("--max-num-queued-tokens", {"type": int}),
    ("--long-prefill-token-threshold", {"type": int}),
    ("--max-logprobs", {"type": int}),
    ("--long-prefill-token-threshold-adaptive", {}),
    ("--max-num-inflight-kv-loads", {"type": int}),  # (vLLM 0.34.0)
    ("--cache-aware-admission-window", {"type": int}),
    ("--cache-aware-admission-threshold", {"type": float}),
    ("--block-size", {"type": int}),
    ("--num-gpu-blocks-override", {"type": int}),
    ("--cpu-offload-gb", {"type": float}),
    ("--kv-cache-dtype", {}),
    ("--speculative-config", {}),
    ("--kv-events-config", {}),
    ("--kv-transfer-config", {}),
    ("--kv-offloading-size", {"type": float}),
    ("--kv-offloading-backend", {}),
    ("--pooler-config", {}),
    ("--prefix-caching-hash-algo", {}),
    ("--enable-lora", {}),
    ("--max-loras", {"type": int}),
    ("--max-lora-rank", {"type": int}),
    ("--max-cpu-loras", {"type": int}),
    ("--lora-modules", {}),
    ("--enable-sleep-mode", {}),
    ("--checkpoint-prepare-on-startup", {}),  # (vLLM 0.34.0)
    ("--enable-fault-tolerance", {}),  # (vLLM 0.34.0)
    ("--fault-tolerance-config", {}),
    ("--kv-cache-metrics", {}),
    ("--kv-cache-metrics-sample", {"type": float}),
    ("--per-request-spec-decode-metrics", {}),
    ("--api-key", {}),
    ("--ssl-keyfile", {}),
    ("--ssl-certfile", {}),
    ("--ssl-ca-certs", {}),
    ("--ssl-cert-reqs", {"type": int}),
    ("--api-server-count", {"type": int}),
    ("--stream-interval", {"type": int}),
    ("--enable-server-load-tracking", {}),
    ("--enable-scale-out", {}),
    ("--enable-tokenizer-info-endpoint", {}),
    ("--enable-force-include-usage", {}),
    ("--enable-per-request-metrics", {}),
    ("--disable-log-stats", {}),
    ("--response-role", {}),
    ("--return-tokens-as-token-ids", {}),
    ("--enable-auto-tool-choice", {}),
    ("--tool-call-parser", {}),
    ("--custom-histogram-buckets", {}),
    ("--profiler-config", {}),
    ("--show-hidden-metrics-for-version", {}),
    ("--h11-max-incomplete-event-size", {"type": int}),
    ("--h11-max-header-count", {"type": int}),
    ("--sse-keep-alive-interval", {"type": int}),  # (vLLM 0.34.0)
    ("--chat-template", {}),  # a cross-encoder's pair prompt (server/engine/score_template)
)

# how vLLM fetches, loads or names weights, logs, traces, binds its processes to hardware or
# guards features doppelchip does not serve (media, Cohere's route): nothing is loaded here and
# nothing a client or a dashboard sees changes, so these are accepted without a word
ACCEPTED: tuple[str, ...] = (
    "--tokenizer", "--tokenizer-mode", "--tokenizer-revision", "--revision", "--code-revision",
    "--download-dir", "--load-format", "--config-format", "--hf-token", "--hf-config-path",
    "--ignore-patterns", "--max-parallel-loading-workers", "--safetensors-load-strategy",
    "--shuffle-safetensors-files",  # (vLLM 0.34.0)
    "--safetensors-prefetch-block-size", "--safetensors-prefetch-num-threads",
    "--model-loader-extra-config", "--pt-load-map-location", "--model-impl",
    "--trust-remote-code", "--use-tqdm-on-load", "--allow-deprecated-quantization",
    "--distributed-executor-backend", "--worker-extension-cls", "--worker-cls",
    "--distributed-timeout-seconds", "--cpu-distributed-timeout-seconds", "--device-ids",
    "--numa-bind", "--numa-bind-nodes", "--numa-bind-cpus", "--ray-workers-use-nsight",
    "--logging-config", "--log-config-file", "--uvicorn-log-level", "--enable-log-requests",
    "--enable-log-outputs", "--enable-log-deltas", "--max-log-len", "--log-error-stack",
    "--aggregate-engine-logging", "--enable-logging-iteration-details",
    "--enable-layerwise-nvtx-tracing", "--disable-uvicorn-access-log",
    "--disable-access-log-for-endpoints", "--jit-monitor-mode", "--jit-monitor-verbose",
    "--fail-on-environ-validation", "--disable-fastapi-docs", "--enable-offline-docs",
    "--allowed-origins", "--allowed-methods", "--allowed-headers", "--allow-credentials",
    "--root-path", "--ssl-ciphers", "--enable-ssl-refresh", "--middleware",
    "--allowed-local-media-path", "--allowed-media-domains", "--media-io-kwargs",
    "--cohere-format", "--cohere-is-reasoning-model",
    # where a data-parallel group's leader listens (the ranks of a pod are emulated there)
    "--data-parallel-address", "--data-parallel-rpc-port", "--data-parallel-backend",
    "--headless-client-handshake-address",
    "--master-addr", "--master-port",
    # what doppelchip's front end always does (docs/HTTP.md, "Differences from vLLM"):
    # `usage.prompt_tokens_details.cached_tokens` on every answer, `X-Request-Id` echoed
    "--enable-prompt-tokens-details", "--enable-request-id-headers",
)

# refused before anything starts (exit status 2), with the reason
REFUSED: dict[str, str] = {
    "--uds": "doppelchip listens on TCP only (use --host and --port)",
}
# emulated, checked against the model (cmd_vllm.check_runner: what vLLM would serve)
POOLING = ("--runner", "--convert")
