"""The `vllm serve` parser of `doppelchip vllm serve`: vLLM 0.34.0's every option, with the
strings and value shapes vLLM's own parser gives it (doppelchip/vllm_flags.py), so any
manifest `vllm serve` starts parses here too — and what vLLM refuses is argparse's error here.

Why a module of its own: the translation (doppelchip/cmd_vllm.py) reads a parsed command line;
building that parser from vLLM's option table is a separate, longer step.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from doppelchip.vllm_flags import (
    ACCEPTED,
    PASSTHROUGH,
    POOLING,
    REFUSED,
    VLLM_OPTIONS,
    add_vllm_option,
)

DEFAULT_CHIP = "h100-sxm"


def human_readable_int(value: str) -> int:
    """vLLM's integers: '1k' is 1,000, '1K' 1,024, '25.6k' 25,600; '-1' and 'auto' are -1
    (--max-model-len: the longest context that fits)."""
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if not found:
        return int(value)
    number, suffix = found.groups()
    if suffix.islower():
        return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
    if "." in number:
        raise argparse.ArgumentTypeError(
            f"Decimals are not allowed with binary suffixes like {suffix}. Did you mean to use "
            f"{number}{suffix.lower()} instead?")
    return int(number) * 2 ** (10 * "KMGT".index(suffix) + 10)


def add_serve_arguments(p: argparse.ArgumentParser) -> set[str]:
    """Every `vllm serve` option on `p`; the names (first flags) of the options left
    unemulated, which `translate` warns about when given."""
    p.add_argument("model_tag", nargs="?", help="Hugging Face repository id or catalogue model")
    p.add_argument("--model", help="as the positional model_tag (which wins when both given)")
    p.add_argument("--config", metavar="FILE.yaml", help="flags from a YAML file, as vLLM "
                   "reads it (the command line wins; doppelchip/vllm_argv.py)")
    f = p.add_argument_group("front end (vLLM's FrontendArgs)")
    f.add_argument("--host", help="address to bind (default: $DOPPELCHIP_HOST or 127.0.0.1; "
                   "vLLM binds every interface)")
    f.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000); with "
                   "--grpc, the gRPC port")
    f.add_argument("--grpc-port", type=int,
                   help="gRPC port: doppelchip.v1, vllm.grpc.engine and health (default 50051)")
    add_vllm_option(f, "--grpc", help="serve gRPC (vllm.grpc.engine, as smg's workers reach "
                    "it) on --port; the OpenAI HTTP front end moves to a free port")
    add_vllm_option(f, "--log-level", type=str.upper, choices=["CRITICAL", "ERROR", "WARNING",
                    "INFO", "DEBUG", "NOTSET"], help="logging verbosity (default INFO)")
    e = p.add_argument_group("engine (vLLM's EngineArgs)")
    add_vllm_option(e, "--tensor-parallel-size", dest="tp", type=int,
                    help="chips each layer is sharded over")
    add_vllm_option(e, "--pipeline-parallel-size", dest="pp", type=int,
                    help="pipeline stages (chips = tp x pp per data-parallel rank)")
    add_vllm_option(e, "--dtype", default="auto",
                    help="16-bit weights: the checkpoint's (auto), f16 or bf16")
    add_vllm_option(e, "--quantization", metavar="METHOD",
                    help="vLLM's method name: fp8, awq, gptq, modelopt_fp4, mxfp4, ...")
    add_vllm_option(e, "--gpu-memory-utilization", type=float, metavar="FRACTION",
                    help="share of each chip's memory the engine may use (default 0.92)")
    add_vllm_option(e, "--kv-cache-memory-bytes", type=human_readable_int, metavar="BYTES",
                    help="the KV cache per GPU, whatever --gpu-memory-utilization "
                    "(8g: 8e9, 8G: 8 GiB)")
    add_vllm_option(e, "--max-model-len", type=human_readable_int, metavar="N",
                    help="context length: 32k, 32K, 32768, or auto (-1: the longest that fits)")
    add_vllm_option(e, "--max-num-batched-tokens", type=human_readable_int, metavar="N",
                    help="token budget per step (8k, 8K, 8192)")
    add_vllm_option(e, "--enable-prefix-caching",
                    help="automatic prefix caching (default on; off for an encoder)")
    add_vllm_option(e, "--enable-chunked-prefill",
                    help="chunked prefill (default on; off for an encoder)")
    add_vllm_option(e, "--scheduling-policy", help="queue order (default fcfs)")
    add_vllm_option(e, "--enforce-eager",
                    help="no CUDA/HIP graphs: the host launches every kernel")
    add_vllm_option(e, "--seed", type=int, help="accepted; each deployment is seeded already")
    add_vllm_option(e, "--shutdown-timeout", type=int, metavar="SECONDS",
                    help="on SIGTERM, how long in-flight requests may run before they are "
                    "aborted (default 0: aborted at once, as vLLM)")
    for name in ("--data-parallel-rank", "--data-parallel-start-rank",
                 "--data-parallel-size-local", "--nnodes", "--node-rank"):
        add_vllm_option(e, name, type=int, help="which data-parallel ranks this pod runs "
                        "(doppelchip/vllm_dp.py)")
    for name in ("--data-parallel-external-lb", "--data-parallel-hybrid-lb"):
        add_vllm_option(e, name, help="vLLM's load-balancing mode (doppelchip/vllm_dp.py)")
    add_vllm_option(e, "--data-parallel-multi-port-external-lb",
                    help="one pod per local rank on --port + i, behind a supervisor's "
                    "/health, /ready, /readyz (doppelchip/vllm_multiport.py)")
    for name, kind, default in (("--data-parallel-supervisor-port", int, 9256),
                                ("--dp-supervisor-probe-interval-s", float, 5.0),
                                ("--dp-supervisor-probe-timeout-s", float, 5.0),
                                ("--dp-supervisor-probe-failure-threshold", int, 3)):
        add_vllm_option(e, name, type=kind, default=default,
                        help=f"the multi-port supervisor's (vLLM's default {default})")
    add_vllm_option(e, "--headless", help="a worker node's pod: the leader's pod emulates "
                    "every rank, so this one waits for SIGTERM")
    for name, kwargs in PASSTHROUGH:
        add_vllm_option(e, name, **kwargs, help="as `doppelchip serve`'s flag of this name")
    for name, kind in (("--spec-method", str), ("--spec-model", str), ("--spec-tokens", int)):
        add_vllm_option(e, name, type=kind, help="a key of --speculative-config (vLLM 0.34.0's "
                        "shorthand: method, model, num_speculative_tokens)")
    d = add_doppelchip_arguments(p, "vLLM")
    d.add_argument("--check-integrity", action="store_true",
                   help="engines check their KV pool and queues when idle (tests)")
    taken = {s for a in p._actions for s in a.option_strings}
    quiet = p.add_argument_group("accepted, no effect here (weights are not loaded)")
    for name in ACCEPTED:
        add_vllm_option(quiet, name, help=argparse.SUPPRESS)
    rest = p.add_argument_group("vLLM's other flags: accepted, each named in a warning")
    unemulated: set[str] = set()
    for option in VLLM_OPTIONS:
        if option.name in ACCEPTED or taken & set(option.flags):
            continue
        refused = REFUSED.get(option.name)
        add_vllm_option(rest, option.name, help=f"refused: {refused}" if refused
                        else argparse.SUPPRESS)
        if not refused and option.name not in POOLING:  # (refused by value in translate)
            unemulated.add(option.name)
    return unemulated


def add_doppelchip_arguments(p: argparse.ArgumentParser, engine: str) -> Any:
    """The options an engine's own command line lacks (`--chip`, `--time-scale`, `--cold`,
    defaulted from the environment, as a container sets them), in a group of their own (which
    is returned); `engine` names whose command line it is (vLLM, SGLang)."""
    d = p.add_argument_group(f"doppelchip (no {engine} equivalent)")
    d.add_argument("--chip", default=os.environ.get("DOPPELCHIP_CHIP", DEFAULT_CHIP),
                   help="the emulated chip (default $DOPPELCHIP_CHIP or h100-sxm)")
    # a string default goes through `type` too: a bad $DOPPELCHIP_TIME_SCALE is argparse's error
    d.add_argument("--time-scale", type=float, default=os.environ.get("DOPPELCHIP_TIME_SCALE"),
                   help="wall seconds per emulated second (default $DOPPELCHIP_TIME_SCALE, "
                   "else 1)")
    d.add_argument("--cold", action="store_true",
                   default=os.environ.get("DOPPELCHIP_COLD", "") not in ("", "0"),
                   help=f"start cold, as a new {engine} pod: load the weights before serving "
                   "(default $DOPPELCHIP_COLD)")
    return d


def is_given(value: Any) -> bool:
    """Whether an option's parsed value asks for something (a switch turned off does not; an
    integer 0 does, which `0 in (None, False)` would miss: SGLang's parser types its values).
    `doppelchip sglang serve` reads its options with this too."""
    return value is not None and value is not False
