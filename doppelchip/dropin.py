"""What the engines' own command lines (`vllm serve`, `sglang serve`, `trtllm-serve`: cmd_vllm,
cmd_sglang, cmd_trtllm) share once translated: the `doppelchip serve` pod they start.

Why a module of its own: each drop-in maps its engine's flags its own way, then all three write
the same pod flags, print what they serve, check that the pod can be placed and serve it; that
second half is one rule, not three copies.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any


def pod_flags(values: dict[str, Any]) -> list[str]:
    """`doppelchip serve` flags from {dest: value}: True a bare flag, a list its items, None
    and False nothing."""
    out: list[str] = []
    for dest, value in values.items():
        flag = "--" + dest.replace("_", "-")
        if value is True:
            out.append(flag)
        elif isinstance(value, list):
            out += [flag, *map(str, value)]
        elif value is not None and value is not False:
            out += [flag, str(value)]
    return out


def serve_args(argv: list[str]) -> argparse.Namespace:
    """`doppelchip serve ARGV`, parsed by serve's own parser."""
    from doppelchip import cmd_serve

    parser = argparse.ArgumentParser(prog="doppelchip")
    cmd_serve.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def serve_pod(prog: str, argv: list[str], warnings: list[str], model_path: str,
              fit_model_len: bool) -> int:
    """Print the warnings and the pod's command, then serve it, unless its deployment cannot
    be placed (exit status 2: the engine stops when the model cannot load, and a pod that
    never serves is worse). `model_path`: /v1/models' root, the name the command line gave."""
    for warning in warnings:
        print(f"{prog}: warning: {warning}", file=sys.stderr)
    print(f"{prog}: doppelchip serve {shlex.join(argv)}", file=sys.stderr)
    serve = serve_args(argv)
    serve.model_path = model_path
    problem = unplaceable(serve, fit_model_len)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return serve.func(serve)


def unplaceable(serve: argparse.Namespace, fit_model_len: bool) -> str:
    """Why the pod's deployment cannot be placed ("" when it can). `fit_model_len` (vLLM with
    no --max-model-len): the KV cache must hold one request of the model's whole context;
    otherwise (SGLang, TensorRT-LLM, vLLM's `auto`) it starts with the KV cache that fits."""
    from devices import DeviceError, place
    from doppelchip.cmd_serve import pod_fleet
    from server.config import load_fleet
    from server.engine.scheduler_defaults import scheduler_config

    try:
        deployment = pod_fleet(serve, load_fleet(None)).deployments[0]
        placed = place(deployment.spec(), ranks=deployment.data_parallel_size)
        scheduler_config(deployment, placed)  # (vLLM's SchedulerConfig checks)
    except (DeviceError, ValueError) as e:
        return str(e)
    if fit_model_len and placed.max_context < placed.model.max_context:
        return _kv_too_small(placed)
    return ""


def _kv_too_small(placed: Any) -> str:
    """vLLM 0.33.0's start-up error (`_check_enough_kv_cache_memory`), per worker."""
    workers = placed.chips / placed.dp
    per_token = (sum(placed.memory_bytes(1).values())
                 - sum(placed.memory_bytes(0).values())) / workers
    gib = 2**30
    need, have = per_token * placed.model.max_context, per_token * placed.max_context
    return (f"To serve at least one request with the model's max seq len "
            f"({placed.model.max_context}), ({round(need / gib, 2)} GiB KV cache is needed, "
            f"which is larger than the available KV cache memory ({round(have / gib, 2)} GiB). "
            f"Based on the available memory, the estimated maximum model length is "
            f"{placed.max_context}. Try increasing `gpu_memory_utilization` or decreasing "
            f"`max_model_len` when initializing the engine.")
