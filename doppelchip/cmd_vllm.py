"""`doppelchip vllm serve`: vLLM's own command line, served by doppelchip (docs/VLLM_SERVE.md).

Why it exists: a platform team's manifests (llm-d's model service, the production stack's
Helm chart, KServe) start `vllm serve <Hugging Face repo> --port 8000 -tp 2 ...`. With this
command (also installed as `doppelchip-vllm`, and as `vllm` in the container image) the same
arguments start a doppelchip pod: the repository names a catalogue checkpoint
(`devices/catalog/checkpoints.toml`; a local folder is read from its config.json,
`devices/hf_config.py`), clients send the repository id as `model`, and every
flag vLLM 0.33.0 gives a meaning doppelchip emulates maps onto `doppelchip serve`'s pod mode.
Flags that only load weights, log or configure CORS are accepted and have no effect; flags
whose effect is not emulated are accepted with a warning naming them; anything else is
vLLM's argparse error (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from doppelchip.checkpoint_arg import resolve_checkpoint, weight_format
from doppelchip.dropin import pod_flags, serve_args, serve_pod, unplaceable
from doppelchip.vllm_dp import HEADLESS, local_ranks
from doppelchip.vllm_flags import BY_FLAG, PASSTHROUGH, REFUSED, VLLM_OPTIONS
from doppelchip.vllm_parser import add_serve_arguments, is_given

if TYPE_CHECKING:
    from devices.model import ModelSpec

KV_DTYPES = {"auto": "auto", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
             "bfloat16": "bf16", "float16": "f16"}
LOG_LEVELS = {"CRITICAL": "error", "ERROR": "error", "WARNING": "warning", "INFO": "info",
              "DEBUG": "debug", "NOTSET": "debug"}  # vLLM's LogLevel -> serve's --log-level


def register(subparsers: Any) -> None:
    v = subparsers.add_parser(
        "vllm", help="vLLM's command line (`vllm serve REPO ...`), served by doppelchip",
        description="vLLM's command line: `doppelchip vllm serve meta-llama/Llama-3.1-8B-"
        "Instruct -tp 2 --port 8000` starts the pod `vllm serve` would, on an emulated chip "
        "(--chip, default $DOPPELCHIP_CHIP or h100-sxm). Also installed as `doppelchip-vllm`.")
    sub = v.add_subparsers(dest="vllm_command", required=True, metavar="COMMAND",
                           help="serve (the only vLLM command emulated)")
    p = sub.add_parser("serve", usage="vllm serve [model_tag] [options]",
                       help="start a vLLM-shaped pod (OpenAI HTTP, /metrics, gRPC)",
                       description="vLLM 0.34.0's `vllm serve` flags; docs/VLLM_SERVE.md lists "
                       "what each one does here.")
    p.set_defaults(unemulated=add_serve_arguments(p))
    p.set_defaults(func=cmd_vllm_serve)


SEED_MAX = 2**32 - 1  # vLLM 0.34.0 ModelConfig.seed: Field(ge=0, le=2**32 - 1)


def _refuse(args: argparse.Namespace) -> None:
    """ValueError for a flag whose request doppelchip cannot serve (docs/VLLM_SERVE.md)."""
    for name, reason in REFUSED.items():
        if is_given(getattr(args, BY_FLAG[name].dest)):
            raise ValueError(f"{name}: {reason}")
    if args.headless and args.api_server_count:
        raise ValueError(f"--api-server-count={args.api_server_count} cannot be used with "
                         "--headless (no API servers are started in headless mode).")
    if args.grpc and args.grpc_port is not None:
        raise ValueError("--grpc and --grpc-port are mutually exclusive. Use --grpc --port for "
                         "the Python gRPC server, or --grpc-port beside the HTTP --port.")
    if args.seed is not None and not 0 <= args.seed <= SEED_MAX:  # vLLM 0.34.0's range
        raise ValueError(f"--seed must be in [0, {SEED_MAX}], got {args.seed}")


def check_runner(args: argparse.Namespace, spec: ModelSpec) -> str:
    """The pooling task the model is served for ("": generation), or ValueError for a
    `--runner` / `--convert` / `--hf-overrides` vLLM would not start with
    (`server.engine.hf_overrides.conversion`: an embedding checkpoint is served by the pooling
    runner; a generative one by the generate runner, or converted into an embedding model or a
    classifier)."""
    from server.engine.hf_overrides import conversion

    served = conversion(args.hf_overrides, args.runner, args.convert, spec.name,
                        spec.pooling_task)
    return served.task or spec.pooling_task


def translate(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(`doppelchip serve` arguments, warnings) for a parsed `vllm serve` command line;
    ValueError says what cannot be served."""
    from devices import catalog

    tag = args.model_tag or args.model
    if not tag:
        raise ValueError("no model: give it as `vllm serve MODEL` (a Hugging Face repository "
                         "id such as meta-llama/Llama-3.1-8B-Instruct, or a catalogue model)")
    _refuse(args)
    model, quant = resolve_checkpoint(tag)
    quant = weight_format(quant, args.dtype, args.quantization)
    kv = getattr(args, "kv_cache_dtype", None)
    if kv is not None and kv not in KV_DTYPES:
        raise ValueError(f"--kv-cache-dtype {kv}: emulated are {', '.join(KV_DTYPES)}")
    task = check_runner(args, catalog.get_model(model))
    start, local = local_ranks(args, catalog.get_model(model).is_moe)
    grpc, http = ((args.port, 0) if args.grpc  # vLLM's --grpc: gRPC on --port, no HTTP there
                  else (50051 if args.grpc_port is None else args.grpc_port, args.port))
    out = ["--chip", args.chip, "--engine", "vllm", "--model", model, "--quant", quant,
           "--served-model-name", *(args.served_model_name or [tag]),
           "--host", args.host or os.environ.get("DOPPELCHIP_HOST", "127.0.0.1"),
           "--port", str(grpc), "--http-port", str(http),
           "--drain-grace", str(args.shutdown_timeout or 0)]
    values = {"served_model_name": None,  # given above
              "tp": args.tp, "pp": args.pp, "kv_cache_dtype": KV_DTYPES.get(kv or ""),
              "gpu_memory_utilization": args.gpu_memory_utilization,
              "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
              "max_model_len": None if args.max_model_len == -1 else args.max_model_len,
              "max_num_batched_tokens": args.max_num_batched_tokens,
              "policy": args.scheduling_policy, "time_scale": args.time_scale,
              "log_level": LOG_LEVELS.get(args.log_level or ""),
              "enforce_eager": args.enforce_eager or no_graphs(args),
              "check_integrity": args.check_integrity,
              "cold": args.cold, "prefix_cache": {True: "on", False: "off"}.get(
                  args.enable_prefix_caching),
              "chunked_prefill": {True: "on", False: "off"}.get(args.enable_chunked_prefill),
              "data_parallel_start_rank": start or None, "data_parallel_size_local": local,
              "hf_overrides": args.hf_overrides, "runner": args.runner, "convert": args.convert,
              "speculative_config": speculative_config(args)}
    for name, _ in PASSTHROUGH:
        dest = BY_FLAG[name].dest
        if dest not in values:
            values[dest] = getattr(args, dest)
    out += pod_flags(values)
    warnings = [f"{o.name} is accepted but not emulated: it changes nothing here"
                for o in VLLM_OPTIONS if o.name in args.unemulated
                and is_given(getattr(args, o.dest)) and not understood(o.name, args)]
    if args.chat_template and task != "classify":
        warnings.append("--chat-template renders a cross-encoder's /score and /rerank pairs "
                        "only; chat requests render with the packaged tokenizer's template")
    if args.fault_tolerance_config is not None and not args.enable_fault_tolerance:
        warnings.append("--fault-tolerance-config was passed. Fault tolerance is being "
                        "automatically enabled.")  # (vLLM 0.34.0's EngineArgs)
    if args.async_scheduling is False:  # turns off what vLLM 0.33.0 does by default
        warnings.append("--no-async-scheduling is accepted but not emulated: the steps here "
                        "cost what vLLM's default asynchronous scheduling costs")
    if args.seed is not None:
        warnings.append("--seed: each deployment's sampler is seeded already (0)")
    from server.engine import hf_overrides, pooler_config

    if ignored := sorted(set(hf_overrides.parse(args.hf_overrides)) - set(hf_overrides.EMULATED)):
        warnings.append(f"--hf-overrides: {', '.join(ignored)} accepted but not emulated (only "
                        f"{', '.join(hf_overrides.EMULATED)} change anything here)")
    warnings += pooler_config.problems(args.pooler_config, task)
    return out, warnings


SPEC_FLAGS = (("--spec-method", "spec_method", "method"), ("--spec-model", "spec_model", "model"),
              ("--spec-tokens", "spec_tokens", "num_speculative_tokens"))


def speculative_config(args: argparse.Namespace) -> str | None:
    """`--speculative-config` with vLLM 0.34.0's shorthands merged in (`EngineArgs.
    create_speculative_config`): `--spec-method`, `--spec-model`, `--spec-tokens` set
    `method`, `model`, `num_speculative_tokens`; one given both ways is vLLM's ValueError."""
    given = [(flag, key, getattr(args, dest)) for flag, dest, key in SPEC_FLAGS
             if getattr(args, dest) is not None]
    if not given:
        return args.speculative_config
    try:
        config = json.loads(args.speculative_config) if args.speculative_config else {}
    except ValueError:
        return args.speculative_config  # (the pod's own parser names what is wrong)
    if not isinstance(config, dict):
        return args.speculative_config
    for flag, key, value in given:
        if key in config:
            raise ValueError(f"{flag} and --speculative-config['{key}'] are mutually exclusive")
        config[key] = value
    return json.dumps({k.replace("-", "_"): v for k, v in config.items()})


def _compilation(args: argparse.Namespace) -> dict[str, Any]:
    try:
        doc = json.loads(args.compilation_config or "{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def no_graphs(args: argparse.Namespace) -> bool:
    """vLLM runs without CUDA/HIP graphs, as with --enforce-eager: `-O0` (OptimizationLevel
    O0: "no compilation, no cudagraphs") or `-cc '{"cudagraph_mode": "NONE"}'`."""
    mode = str(_compilation(args).get("cudagraph_mode", "")).upper()
    return args.optimization_level == "0" or mode == "NONE"


def understood(name: str, args: argparse.Namespace) -> bool:
    """An option whose whole effect is emulated: -O0/-O2/-O3 (O2 is vLLM's default, O3 the
    same as O2 in vLLM 0.33.0), a compilation config of cudagraph_mode alone, and
    `--async-scheduling` (vLLM 0.33.0 turns it on by default: `VllmConfig`, unless an option
    it does not support is given; the emulated steps are the default's), `--hf-overrides`
    (`translate` names the keys it ignores) and `--enable-mfu-metrics` (its counters are
    always exported)."""
    if name == "--async-scheduling":
        return args.async_scheduling is True
    if name == "--hf-overrides":  # its keys are checked in `translate`
        return True
    if name == "--enable-mfu-metrics":  # the vllm:estimated_* counters it turns on in vLLM
        return True  # are always exported here (docs/OBSERVABILITY.md)
    if name == "--optimization-level":
        return args.optimization_level in ("0", "2", "3")
    if name == "--compilation-config":
        return set(_compilation(args)) == {"cudagraph_mode"} and no_graphs(args)
    return False


def cmd_vllm_serve(args: argparse.Namespace) -> int:
    ranks = None
    try:
        if args.data_parallel_multi_port_external_lb:  # one pod per local rank
            from doppelchip.vllm_multiport import rank_args

            ranks = rank_args(args)
            argv, warnings = translate(ranks[0])  # what the ranks would refuse: refused now
            for rank in ranks[1:]:
                translate(rank)
        else:
            argv, warnings = translate(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.headless:
        return _idle()
    if ranks is not None:
        from doppelchip.vllm_multiport import Supervisor

        problem = unplaceable(serve_args(argv), args.max_model_len is None)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        return Supervisor(args, ranks, cmd_vllm_serve).run()
    return serve_pod("doppelchip vllm serve", argv, warnings,
                     args.model_tag or args.model,  # /v1/models' root, as vLLM's (no flag)
                     fit_model_len=args.max_model_len is None)


def _idle(note: str = f"doppelchip vllm serve: {HEADLESS}") -> int:
    """A `--headless` worker's pod (or `doppelchip sglang serve`'s pod of a node rank above 0):
    nothing to serve (`note` says why); exit 0 on SIGTERM/SIGINT."""
    import signal
    import threading

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # (handlers run in this, the main, thread)
        signal.signal(sig, lambda *_: stop.set())
    print(note, file=sys.stderr, flush=True)
    while not stop.wait(60):
        pass
    return 0
