"""The `vllm serve` flags `doppelchip vllm serve` takes besides the ones it translates itself
(doppelchip/cmd_vllm.py), by what they do here. Names and value shapes are vLLM 0.33.0's
(`vllm/engine/arg_utils.py`, `vllm/entrypoints/common/cli_args.py`); docs/VLLM_SERVE.md has
the table.

Why a module of its own: the lists are data, longer than the code that uses them.
"""

from __future__ import annotations

import argparse
from typing import Any

_BOOL = {"action": argparse.BooleanOptionalAction}  # vLLM's booleans take --no-X too

# the same name and meaning as `doppelchip serve`'s flag: passed through unchanged
PASSTHROUGH: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--served-model-name",), {"nargs": "+"}),
    (("--data-parallel-size", "-dp"), {"type": int}),
    (("--enable-expert-parallel", "-ep"), _BOOL),
    (("--max-num-seqs",), {"type": int}),
    (("--block-size",), {"type": int}),
    (("--num-gpu-blocks-override",), {"type": int}),
    (("--cpu-offload-gb",), {"type": float}),
    (("--kv-cache-dtype",), {}),
    (("--speculative-config", "-sc"), {}),
    (("--kv-events-config",), {}),
    (("--kv-transfer-config",), {}),
    (("--prefix-caching-hash-algo",),
     {"choices": ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]}),
    (("--enable-lora",), _BOOL),
    (("--max-loras",), {"type": int}),
    (("--max-lora-rank",), {"type": int}),
    (("--max-cpu-loras",), {"type": int}),
    (("--lora-modules",), {"nargs": "+"}),
    (("--enable-sleep-mode",), _BOOL),
    (("--kv-cache-metrics",), _BOOL),
    (("--kv-cache-metrics-sample",), {"type": float}),
    (("--api-key",), {"nargs": "+"}),
    (("--ssl-keyfile",), {}),
    (("--ssl-certfile",), {}),
    (("--ssl-ca-certs",), {}),
    (("--ssl-cert-reqs",), {"type": int}),
    (("--api-server-count", "-asc"), {"type": int}),
    (("--stream-interval",), {"type": int}),
    (("--enable-server-load-tracking",), _BOOL),
    (("--enable-scale-out",), _BOOL),
    (("--enable-tokenizer-info-endpoint",), _BOOL),
    (("--enable-auto-tool-choice",), _BOOL),
    (("--tool-call-parser",), {}),
    (("--custom-histogram-buckets",), {}),
    (("--profiler-config",), {}),
    (("--show-hidden-metrics-for-version",), {}),
)

# how vLLM fetches, loads or names weights and logs or guards its front end: nothing of it
# is emulated because nothing is loaded, and nothing a client sees changes
ACCEPTED_FLAGS: tuple[tuple[str, ...], ...] = (
    ("--tokenizer",), ("--tokenizer-mode",), ("--tokenizer-revision",), ("--revision",),
    ("--code-revision",), ("--download-dir",), ("--load-format",), ("--config-format",),
    ("--hf-token",), ("--hf-config-path",), ("--ignore-patterns",),
    ("--max-parallel-loading-workers",), ("--safetensors-load-strategy",), ("--model-impl",),
    ("--distributed-executor-backend",), ("--worker-extension-cls",), ("--logging-config",),
    ("--uvicorn-log-level",), ("--disable-access-log-for-endpoints",), ("--max-log-len",),
    ("--allowed-origins",), ("--allowed-methods",), ("--allowed-headers",), ("--root-path",),
)
ACCEPTED_SWITCHES: tuple[tuple[str, ...], ...] = (
    ("--trust-remote-code",), ("--use-tqdm-on-load",), ("--enable-log-requests",),
    ("--enable-log-outputs",), ("--disable-uvicorn-access-log",), ("--disable-fastapi-docs",),
    ("--allow-credentials",),
)

# flags that change speed or answers in vLLM in ways doppelchip does not emulate: accepted so
# a manifest starts, and named in a warning at start-up
UNMODELLED_FLAGS: tuple[tuple[str, ...], ...] = (
    ("--compilation-config", "-cc"), ("--attention-backend",), ("--max-cudagraph-capture-size",),
    ("--kv-offloading-size",), ("--limit-mm-per-prompt",),
    ("--chat-template",), ("--generation-config",), ("--reasoning-parser",),
    ("--otlp-traces-endpoint",),
)
UNMODELLED_SWITCHES: tuple[tuple[str, ...], ...] = (
    ("--async-scheduling",), ("--disable-custom-all-reduce",), ("--disable-cascade-attn",),
    ("--disable-sliding-window",), ("--disable-log-stats",), ("--enable-ssl-refresh",),
)
