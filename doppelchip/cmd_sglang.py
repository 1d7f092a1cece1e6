"""`doppelchip sglang serve`: SGLang's own launch command line, served by doppelchip
(docs/SGLANG_SERVE.md).

Why it exists: manifests and scripts start SGLang as `python -m sglang.launch_server
--model-path REPO --tp 2 --port 30000` or `sglang serve REPO ...` (RBG, OME, SkyPilot, the
SGLang cookbook). With this command (also installed as `doppelchip-sglang`; `launch_server` is
an alias of `serve`) the same arguments start a doppelchip pod that speaks SGLang's HTTP API
(`doppelchip serve --http-api sglang --engine sglang`; its gRPC port serves SGLang's
scheduler service, on --port with --smg-grpc-mode): the model resolves as for `doppelchip
vllm serve` (doppelchip/checkpoint_arg.py), and every flag SGLang 0.5.23 gives a meaning
doppelchip emulates maps onto `doppelchip serve`'s pod mode. Flags that only load weights, log
or bind processes are accepted and have no effect; flags whose effect is not emulated are
accepted with a warning naming them; what cannot be served is refused (exit status 2); a flag
SGLang does not define is argparse's error (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from doppelchip import sglang_spec
from doppelchip.checkpoint_arg import resolve_checkpoint, weight_format
from doppelchip.dropin import pod_flags, serve_pod
from doppelchip.sglang_flags import BY_FLAG, REFUSED, SGLANG_OPTIONS, SGLANG_VERSION
from doppelchip.sglang_parser import add_serve_arguments
from doppelchip.vllm_parser import is_given

# SGLang's --quantization methods whose weight format the catalogue has, as vLLM's method
# names (devices/catalog/quants.toml `vllm_quantization`); `modelopt` keeps a ModelOpt
# checkpoint's own format (SGLang: "Auto-detect, defaults to FP8")
QUANTIZATION = {"fp8": "fp8", "modelopt": "modelopt", "modelopt_fp8": "fp8", "w8a8_fp8": "fp8",
                "modelopt_fp4": "modelopt_fp4", "mxfp4": "mxfp4", "awq": "awq",
                "awq_marlin": "awq_marlin", "gptq": "gptq", "gptq_marlin": "gptq_marlin"}
KV_DTYPES = {"auto": "auto", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "bf16": "bf16",
             "bfloat16": "bf16"}
LOG_LEVELS = {"critical": "error", "fatal": "error", "error": "error", "warning": "warning",
              "warn": "warning", "info": "info", "debug": "debug", "notset": "debug"}
POLICIES = ("fcfs", "lpm")  # SGLang's schedule policies doppelchip's queues implement
FOLLOWER = ("--node-rank: the pod of node rank 0 (the one with the HTTP server) emulates the "
            "GPUs of every node, so this one runs no engine; it waits for SIGTERM, as SGLang's "
            "other nodes serve no HTTP")


def register(subparsers: Any) -> None:
    s = subparsers.add_parser(
        "sglang", help="SGLang's command line (`sglang serve --model-path REPO ...`), served "
        "by doppelchip",
        description="SGLang's launch command line: `doppelchip sglang serve --model-path "
        "meta-llama/Llama-3.1-8B-Instruct --tp 2 --port 30000` starts the pod `sglang serve` "
        "(or `python -m sglang.launch_server`) would, speaking SGLang's HTTP API, on an "
        "emulated chip (--chip, default $DOPPELCHIP_CHIP or h100-sxm). Also installed as "
        "`doppelchip-sglang`.")
    sub = s.add_subparsers(dest="sglang_command", required=True, metavar="COMMAND",
                           help="serve (launch_server: the same; the only SGLang command "
                           "emulated)")
    p = sub.add_parser("serve", aliases=["launch_server"],
                       usage="sglang serve --model-path REPO [options]",
                       help="start an SGLang-shaped pod (SGLang's HTTP API, gRPC)",
                       description=f"SGLang {SGLANG_VERSION}'s `sglang serve` flags; "
                       "docs/SGLANG_SERVE.md lists what each one does here.")
    p.set_defaults(unemulated=add_serve_arguments(p), func=cmd_sglang_serve)


def _refuse(args: argparse.Namespace) -> None:
    """ValueError for a flag whose request doppelchip cannot serve (docs/SGLANG_SERVE.md)."""
    for name, reason in REFUSED.items():
        if is_given(getattr(args, BY_FLAG[name].dest)):
            raise ValueError(f"{name}: {reason}")
    if args.disaggregation_mode not in (None, "null"):
        raise ValueError(f"--disaggregation-mode {args.disaggregation_mode}: SGLang's "
                         "prefill/decode disaggregation (its bootstrap server and KV transfer "
                         "engines) is not emulated; doppelchip's P/D is vLLM's "
                         "(`doppelchip vllm serve --kv-transfer-config`, docs/PD.md)")
    if args.enable_lora or args.lora_paths is not None:
        raise ValueError("--enable-lora/--lora-paths: LoRA adapters are not emulated on an "
                         "SGLang pod (`doppelchip vllm serve --enable-lora` serves them)")
    if args.log_level is not None and args.log_level.lower() not in LOG_LEVELS:
        raise ValueError(f"--log-level {args.log_level}: not a logging level "
                         f"({', '.join(LOG_LEVELS)})")
    if args.kv_cache_dtype is not None and args.kv_cache_dtype not in KV_DTYPES:
        raise ValueError(f"--kv-cache-dtype {args.kv_cache_dtype}: emulated are "
                         f"{', '.join(KV_DTYPES)}")
    if args.quantization and args.quantization not in QUANTIZATION:
        raise ValueError(f"--quantization {args.quantization}: no catalogue weight format "
                         f"for it (emulated: {', '.join(QUANTIZATION)})")


# SGLang's KVEventsConfig (sglang/srt/disaggregation/kv_events.py): its keys, and vLLM's
# `enable_kv_cache_events`, which SGLang does not have (a "zmq" publisher is events on)
SGLANG_KV_EVENTS = ("publisher", "endpoint", "replay_endpoint", "buffer_steps", "hwm",
                    "max_queue_size", "topic")


def kv_events(text: str | None) -> str | None:
    """The pod's `--kv-events-config` (vLLM's JSON, which the engine reads) for SGLang's
    `--kv-events-config`; None without a "zmq" publisher. ValueError for what is not SGLang's
    or not emulated (placement snapshots)."""
    from server.engine.json_config import json_object

    if not text:
        return None
    doc = json_object(text, "--kv-events-config", (*SGLANG_KV_EVENTS, "snapshot_endpoint"))
    if "snapshot_endpoint" in doc:
        raise ValueError("--kv-events-config: snapshot_endpoint: SGLang's placement "
                         "snapshots are not emulated (the replay_endpoint is)")
    if doc.get("publisher", "null") != "zmq":
        return None
    return json.dumps({"enable_kv_cache_events": True, **doc}, separators=(",", ":"))


def policy(args: argparse.Namespace) -> str:
    """doppelchip's queue policy for SGLang's `--schedule-policy` (default fcfs in 0.5.23) and
    priority flags; ValueError for what its queues do not implement."""
    name = args.schedule_policy or "fcfs"
    if args.enable_priority_scheduling:
        if name not in ("fcfs", "lof"):  # SGLang's own check
            raise ValueError("To use priority scheduling, schedule_policy must be 'fcfs' or "
                             f"'lof'. '{name}' is not supported.")
        if name == "lof" or not args.schedule_low_priority_values_first:
            raise ValueError("--enable-priority-scheduling: emulated with --schedule-policy "
                             "fcfs and --schedule-low-priority-values-first (doppelchip's "
                             "priority queue, vLLM's, runs lower values first)")
        return "priority"
    if name not in POLICIES:
        raise ValueError(f"--schedule-policy {name}: emulated are {', '.join(POLICIES)}")
    # SGLang runs a cache-aware policy as FCFS without a radix cache (SchedulePolicy)
    return "fcfs" if args.disable_radix_cache else name


def parallel(args: argparse.Namespace) -> dict[str, int | None]:
    """`doppelchip serve`'s chip layout for SGLang's parallel sizes, checked with SGLang's
    words. Attention data parallelism (`--attn-dp-size A`, or the deprecated `--dp-size A
    --enable-dp-attention`) keeps tp x pp chips, with A attention replicas of tp / A chips:
    doppelchip's `--count` over `--tp` (devices.DeploymentSpec)."""
    tp, pp, dp, ep = (args.tp_size or 1, args.pp_size or 1, args.dp_size or 1,
                      args.ep_size or 1)
    attn, moe_dp = args.attn_dp_size or 1, args.moe_dp_size or 1
    if args.enable_dp_attention and attn == 1:
        attn, dp = dp, 1
    if attn < 1:
        raise ValueError(f"--attn-dp-size must be positive (got {attn}).")
    if attn > 1 and dp > 1:
        raise ValueError(f"--dp-size {dp} with --attn-dp-size {attn}: data-parallel replicas "
                         "combined with attention data parallelism are not supported.")
    if tp % attn:
        raise ValueError("tp_size must be divisible by attn_dp_size * attn_cp_size")
    if ep * moe_dp > tp:
        raise ValueError("ep_size * moe_dp_size must be less than or equal to tp_size")
    if ep > 1 and ep * moe_dp != tp:
        raise ValueError("ep_size * moe_dp_size must be equal to tp_size")
    return {"count": tp * pp if attn > 1 else None,
            "tp": tp // attn if attn > 1 or args.tp_size else None,
            "pp": args.pp_size, "ep": ep if ep > 1 else None,
            "data_parallel_size": dp if dp > 1 else None}


def _ports(args: argparse.Namespace) -> list[str]:
    """`--port`/`--http-port`: SGLang's HTTP server on --port (default 30000) and doppelchip's
    gRPC port on --grpc-port (default 50051); with --smg-grpc-mode (or the deprecated
    --grpc-mode) the gRPC scheduler service on --port, as smg-grpc-servicer binds it, and the
    HTTP API on the sidecar's port (--smg-http-sidecar-port, default --port + 1)."""
    port = 30000 if args.port is None else args.port
    if args.smg_grpc_mode or args.grpc_mode:
        sidecar = args.smg_http_sidecar_port
        return ["--port", str(port), "--http-port", str(port + 1 if sidecar is None
                                                        else sidecar)]
    return ["--port", str(50051 if args.grpc_port is None else args.grpc_port),
            "--http-port", str(port)]


def translate(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(`doppelchip serve` arguments, warnings) for a parsed `sglang serve` command line;
    ValueError says what cannot be served."""
    from devices import catalog

    tag = args.model_path
    _refuse(args)
    model, checkpoint_quant = resolve_checkpoint(tag)
    quant = weight_format(checkpoint_quant, args.dtype, args.quantization, QUANTIZATION)
    if args.quantization == "modelopt" and checkpoint_quant in ("fp8", "nvfp4"):
        quant = checkpoint_quant  # a ModelOpt checkpoint's own format
    if args.is_embedding and not catalog.get_model(model).is_pooling:
        raise ValueError(f"--is-embedding: {tag} is a generative checkpoint ({model}); "
                         "serving it as an embedding model is not emulated on an SGLang pod")
    chunk = args.chunked_prefill_size
    # SGLang's speculative decoding; the engine tallies each request's verification steps,
    # which /generate's meta_info reports (doppelchip/sglang_spec.py)
    speculative, spec_warnings = sglang_spec.speculative_config(args, catalog.get_model(model))
    out = ["--chip", args.chip, "--engine", "sglang", "--http-api", "sglang",
           "--model", model, "--quant", quant, "--served-model-name",
           args.served_model_name or tag,
           "--host", args.host or os.environ.get("DOPPELCHIP_HOST", "127.0.0.1"),
           *_ports(args),
           "--policy", policy(args)]
    values: dict[str, Any] = {
        **parallel(args), "max_model_len": args.context_length,
        "gpu_memory_utilization": args.mem_fraction_static,
        "max_num_seqs": args.max_running_requests or (sglang_spec.MAX_RUNNING if speculative
                                                       else None),
        "speculative_config": speculative,
        "per_request_spec_decode_metrics": "summary" if speculative else None,
        "max_num_batched_tokens": chunk if chunk is not None and chunk > 0 else None,
        "chunked_prefill": "off" if chunk is not None and chunk <= 0 else None,
        "block_size": args.page_size,
        "kv_events_config": kv_events(args.kv_events_config),
        "prefix_cache": "off" if args.disable_radix_cache else None,
        "kv_cache_dtype": KV_DTYPES.get(args.kv_cache_dtype or ""),
        "enforce_eager": args.disable_cuda_graph or args.cuda_graph_backend_decode == "disabled",
        "cpu_offload_gb": args.cpu_offload_gb, "enable_metrics": args.enable_metrics,
        "api_key": args.api_key, "ssl_keyfile": args.ssl_keyfile,
        "ssl_certfile": args.ssl_certfile, "ssl_ca_certs": args.ssl_ca_certs,
        "stream_interval": args.stream_interval,
        "log_level": LOG_LEVELS.get((args.log_level or "").lower()),
        "time_scale": args.time_scale, "cold": args.cold}
    return out + pod_flags(values), _warnings(args) + spec_warnings


def _warnings(args: argparse.Namespace) -> list[str]:
    """What is accepted but not emulated: each given SGLang option of the unemulated ones
    (options sharing a destination, which argparse cannot tell apart, are named together),
    and the translated options' parts that change nothing here."""
    names: dict[str, list[str]] = {}
    for o in SGLANG_OPTIONS:
        if o.name in args.unemulated and is_given(getattr(args, o.dest)) \
                and not (o.name == "--moe-dp-size" and (args.ep_size or 1) > 1):
            names.setdefault(o.dest, []).append(o.name)  # (--moe-dp-size: understood by --ep)
    out = [f"{'/'.join(n)} is accepted but not emulated: it changes nothing here"
           for n in names.values()]
    if args.grpc_mode and not args.smg_grpc_mode:  # SGLang's own warning
        out.append("--grpc-mode is deprecated and will be removed in a future version. Use "
                   "--smg-grpc-mode for the legacy SMG gRPC server, or --grpc-port for the "
                   "native gRPC server.")
    if (args.smg_grpc_mode or args.grpc_mode) and args.grpc_port is not None:
        out.append("--grpc-port is not used with --smg-grpc-mode: the scheduler service is "
                   "on --port")
    if args.max_prefill_tokens is not None:
        out.append("--max-prefill-tokens is accepted but not emulated: a step's prefill "
                   "tokens are bounded by --chunked-prefill-size here")
    if args.random_seed is not None:
        out.append("--random-seed: each deployment's sampler is seeded already (0)")
    if args.config is not None:
        out.append("--config=FILE is not read: SGLang reads a config file given as "
                   "`--config FILE` only")
    return out


def cmd_sglang_serve(args: argparse.Namespace) -> int:
    from doppelchip.cmd_vllm import _idle

    prog = f"doppelchip sglang {args.sglang_command}"
    try:
        argv, warnings = translate(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if (args.nnodes or 1) > 1 and (args.node_rank or 0) > 0:
        return _idle(f"{prog}: {FOLLOWER}")
    # SGLang starts whatever its KV pool holds: requests are capped at the pool, not refused
    return serve_pod(prog, argv, warnings, args.model_path, fit_model_len=False)
