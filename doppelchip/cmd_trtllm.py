"""`doppelchip trtllm-serve`: TensorRT-LLM's `trtllm-serve MODEL [--grpc]` command line, served
by doppelchip (docs/TRTLLM_SERVE.md).

Why it exists: manifests and llm-d's guides run `trtllm-serve MODEL ...` (its OpenAI HTTP
server, which llm-d's endpoint picker scrapes on /prometheus/metrics), and the smg gateway starts
TensorRT-LLM workers as `python -m tensorrt_llm.commands.serve MODEL --grpc --host H --port P
...` (smg's TrtllmWorkerLauncher). With this command (also installed as
`doppelchip-trtllm-serve`) the same arguments start a doppelchip pod on an emulated chip
(`doppelchip serve --engine tensorrt-llm`):

- without --grpc, trtllm-serve's OpenAI server (`--http-api trtllm`: /health, /v1/models,
  completions, chat, iteration stats on /metrics, and with the YAML's return_perf_metrics or
  enable_iter_perf_stats, `--enable-metrics`: /prometheus/metrics) on --port, and doppelchip's
  gRPC port (doppelchip.v1, trtllm.TrtllmService) on --grpc-port, default 50051: the
  convention of `doppelchip vllm serve`, whose --port is HTTP too;
- with --grpc, TensorRT-LLM's gRPC service trtllm.TrtllmService on --port (`--grpc-api
  trtllm`), and doppelchip's own HTTP API (vLLM's OpenAI server, /metrics) on --http-port:
  TensorRT-LLM's gRPC mode has no HTTP server.

The model resolves as for `doppelchip vllm serve` (doppelchip/checkpoint_arg.py); the sizes
TensorRT-LLM's flags and `--config` YAML set map onto the pod (doppelchip/trtllm_config.py
merges the two as TensorRT-LLM does). Flags that only load, log or bind processes are accepted
with no effect; flags whose effect is not emulated are accepted with a warning naming them;
what cannot be served is refused (exit status 2), as is a flag trtllm-serve does not define
(argparse's error). An option's role can differ between the two modes (trtllm_flags.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from doppelchip.dropin import pod_flags, serve_pod
from doppelchip.trtllm_config import Settings, merge
from doppelchip.trtllm_flags import (
    BACKENDS,
    GRPC_NAMES,
    GRPC_PORT,
    GRPC_REFUSED,
    LOG_LEVELS,
    OPTIONS,
    REFUSED,
    WARNED,
    add_arguments,
)
from doppelchip.trtllm_spec import speculative_config
from doppelchip.vllm_parser import is_given

PROG = "doppelchip trtllm-serve"
GRPC_REASON = ("The gRPC server is designed for use with external routers that handle these "
               "features (e.g., tool parsing, chat templates).")  # TensorRT-LLM's words
DISAGG = ("metadata_server_config_file", "server_role", "disagg_cluster_uri")
NO_DISAGG = "disaggregated serving is not emulated (doppelchip's P/D is vLLM's, docs/PD.md)"
METRICS = ("return_perf_metrics", "enable_iter_perf_stats")  # the YAML's HTTP metrics


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "trtllm-serve", allow_abbrev=False, usage="trtllm-serve MODEL [--grpc] [options]",
        help="TensorRT-LLM's command line (`trtllm-serve MODEL [--grpc] ...`), served by "
        "doppelchip",
        description="TensorRT-LLM's `trtllm-serve MODEL` command line, on an emulated chip "
        "(--chip, default $DOPPELCHIP_CHIP or h100-sxm). Without --grpc: trtllm-serve's OpenAI "
        "HTTP server on --port (/health, /v1/models, completions, chat, /metrics; "
        "/prometheus/metrics when the --config YAML sets return_perf_metrics or "
        "enable_iter_perf_stats), doppelchip's gRPC port on --grpc-port (default 50051). With "
        "--grpc (what the smg gateway launches as `python -m tensorrt_llm.commands.serve`): "
        "TensorRT-LLM's gRPC service trtllm.TrtllmService on --port, doppelchip's OpenAI HTTP "
        "API and /metrics on --http-port. Options use TensorRT-LLM's spellings; "
        "docs/TRTLLM_SERVE.md says what each does here. Also installed as "
        "`doppelchip-trtllm-serve`.")
    add_arguments(p)
    p.set_defaults(func=cmd_trtllm_serve)


def _refuse(args: argparse.Namespace) -> None:
    """ValueError for a command line TensorRT-LLM (in the mode --grpc picks) or doppelchip
    cannot serve."""
    for o in OPTIONS:
        if not is_given(getattr(args, o.dest)):
            continue
        role = o.role_in(args.grpc)
        if role == GRPC_REFUSED:
            more = f"; {NO_DISAGG}" if o.dest in DISAGG else ""
            raise ValueError(f"{o.name}: Argument '{GRPC_NAMES.get(o.dest, o.dest)}' is not "
                             f"supported when running in gRPC mode. {GRPC_REASON}{more}")
        if role == REFUSED and o.dest in DISAGG:  # (HTTP mode)
            raise ValueError(f"{o.name}: TensorRT-LLM's {NO_DISAGG}")
        if role == REFUSED:
            said = ("--grpc is not supported by the VisualGen server (TensorRT-LLM's words); "
                    if args.grpc else "TensorRT-LLM's VisualGen server: ")
            raise ValueError(f"{o.name}: {said}image and video generation is not emulated")
    if args.grpc and args.grpc_protocol == "openengine":
        raise ValueError("--grpc-protocol openengine: TensorRT-LLM's OpenEngine protocol is "
                         "not emulated; smg's (trtllm.TrtllmService, the default) is")
    if args.grpc and args.grpc_port is not None:
        raise ValueError("--grpc-port: with --grpc the gRPC service is on --port (and the pod's "
                         "HTTP API on --http-port)")
    if not args.grpc and args.http_port is not None:
        raise ValueError("--http-port: without --grpc trtllm-serve's HTTP server is on --port "
                         "(and the pod's gRPC port is --grpc-port)")
    if args.media_io_kwargs is not None:
        try:
            json.loads(args.media_io_kwargs)
        except json.JSONDecodeError as e:
            raise ValueError(f"--media_io_kwargs: Invalid JSON for media_io_kwargs: {e}") \
                from None


def _refuse_values(s: Settings) -> None:
    """ValueError for merged settings (flags and YAML) that cannot be served here."""
    f, kv = s.fields, s.kv
    if f["backend"] not in BACKENDS:
        raise ValueError(f"{s.label('backend')} {f['backend']!r}: not a backend "
                         f"({', '.join(BACKENDS)})")
    if f["context_parallel_size"] > 1:
        raise ValueError(f"{s.label('context_parallel_size')} {f['context_parallel_size']}: "
                         "context parallelism (one request's sequence split over chips) is "
                         "not emulated")
    if f["max_beam_width"] > 1:
        raise ValueError(f"{s.label('max_beam_width')} {f['max_beam_width']}: beam search is "
                         "not emulated (a request with beam_width > 1 is refused); serve with "
                         "max_beam_width 1")
    if kv["dtype"] not in ("auto", "fp8"):
        raise ValueError(f"{s.label('kv_cache_config.dtype')} {kv['dtype']}: emulated KV cache "
                         "dtypes are auto and fp8" + (" (an NVFP4 KV cache is not)"
                                                      if kv["dtype"] == "nvfp4" else ""))
    if f["dtype"] in ("float", "float32"):
        raise ValueError(f"{s.label('dtype')} {f['dtype']}: the catalogue has no 32-bit weight "
                         "format")
    tp, ep = f["tensor_parallel_size"], f["moe_expert_parallel_size"]
    if ep is not None and tp % ep:  # TensorRT-LLM's Mapping: moe_tp x moe_ep = tp
        raise ValueError(f"tp_size must equal to moe_tp_size * moe_ep_size * "
                         f"moe_cluster_size, but got {tp} != {tp // ep} * {ep} * 1")


def _address(args: argparse.Namespace) -> list[str]:
    """The pod's `--host H --port G --http-port M`: trtllm-serve's host (localhost, its default,
    bound as 127.0.0.1) and port P (8000). With --grpc, P is the gRPC port (G) and doppelchip's
    HTTP API is on --http-port, default P + 1; without, P is the HTTP port (M), as trtllm-serve's
    OpenAI server binds it, and the gRPC port is --grpc-port, default 50051 as for `doppelchip
    vllm serve`. A default is 0 (a free port) when P is 0."""
    host = args.host or os.environ.get("DOPPELCHIP_HOST") or "localhost"
    port = 8000 if args.port is None else args.port
    if args.grpc:
        other = ("--http-port", args.http_port if args.http_port is not None
                 else (port + 1 if port else 0))
    else:
        other = ("--grpc-port", args.grpc_port if args.grpc_port is not None
                 else (GRPC_PORT if port else 0))
    for flag, value in (("--port", port), other):
        if not 0 <= value <= 65535:
            raise ValueError(f"{flag} {value}: not a TCP port (0-65535)")
    if not args.grpc and port and other[1] == port:
        raise ValueError(f"--port {port}: the gRPC port (--grpc-port, default {GRPC_PORT}) is "
                         "the same port; give --grpc-port another")
    grpc, http = (port, other[1]) if args.grpc else (other[1], port)
    return ["--host", "127.0.0.1" if host == "localhost" else host, "--port", str(grpc),
            "--http-port", str(http)]


# TensorRT-LLM keeps KV cache events (what its gRPC SubscribeKvEvents streams to smg's
# cache-aware router, and its HTTP POST /kv_cache_events returns) when
# kv_cache_config.event_buffer_max_size > 0 and blocks are reused; the pod publishes its own on
# free ports (bound on loopback unless the pod binds all interfaces), which the gRPC relay and
# the HTTP route (through the replay socket) read
EVENTS = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:0",
          "replay_endpoint": "tcp://*:0"}


def kv_events(kv: dict[str, Any]) -> str | None:
    """`--kv-events-config` for the pod: events on when TensorRT-LLM would keep them. The
    replay buffer keeps `event_buffer_max_size` batches (TensorRT-LLM's buffer counts events;
    a published batch holds one or more, so nothing TensorRT-LLM would still hold is lost)."""
    size = kv["event_buffer_max_size"]
    if size > 0 and kv["enable_block_reuse"]:
        return json.dumps({**EVENTS, "buffer_steps": size}, separators=(",", ":"))
    return None


def translate(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(`doppelchip serve` arguments, warnings) for a parsed `trtllm-serve` command line;
    ValueError says what cannot be served."""
    from devices import catalog
    from doppelchip.checkpoint_arg import resolve_checkpoint, weight_format

    _refuse(args)
    s = merge(args)
    _refuse_values(s)
    f, kv = s.fields, s.kv
    tag = args.model
    model, checkpoint_quant = resolve_checkpoint(tag)
    spec = catalog.get_model(model)
    tp, pp, ep = (f["tensor_parallel_size"], f["pipeline_parallel_size"],
                  f["moe_expert_parallel_size"])
    attention_dp = f["enable_attention_dp"] and tp > 1
    length, budget = f["max_seq_len"] or spec.max_context, f["max_num_tokens"]
    unchunked = not f["enable_chunked_prefill"] and budget >= length
    fraction = kv["free_gpu_memory_fraction"]
    speculative, spec_warnings = speculative_config(
        s.speculative, s.label("speculative_config"), spec)
    api = "--grpc-api" if args.grpc else "--http-api"  # (an HTTP pod's gRPC API follows it)
    out = ["--chip", args.chip, "--engine", "tensorrt-llm", api, "trtllm",
           "--model", model, "--quant", weight_format(checkpoint_quant, f["dtype"], None),
           "--served-model-name", args.served_model_name or tag, *_address(args)]
    values: dict[str, Any] = {
        "count": tp * pp if attention_dp else None,
        "tp": 1 if attention_dp else (tp if tp > 1 else None), "pp": pp if pp > 1 else None,
        "ep": ep if spec.is_moe and ep and ep > 1 else None,  # (none in a dense model)
        "max_num_seqs": f["max_batch_size"], "max_num_batched_tokens": budget,
        "max_model_len": f["max_seq_len"], "chunked_prefill": "off" if unchunked else None,
        "block_size": kv["tokens_per_block"],
        "gpu_memory_utilization": fraction if fraction != 0.9 else None,
        "prefix_cache": None if kv["enable_block_reuse"] else "off",
        "kv_cache_dtype": "fp8" if kv["dtype"] == "fp8" else None,
        "kv_events_config": kv_events(kv), "speculative_config": speculative,
        "enable_metrics": not args.grpc and any(f[k] for k in METRICS),
        "log_level": LOG_LEVELS.get(args.log_level or ""),
        "time_scale": args.time_scale, "cold": args.cold}
    out += pod_flags(values)
    warnings = _warnings(args, s) + spec_warnings
    if not f["enable_chunked_prefill"] and not unchunked:
        warnings.append(f"without --enable_chunked_prefill TensorRT-LLM refuses prompts longer "
                        f"than max_num_tokens ({budget}); this pod prefills them in chunks")
    return out, warnings


def _warnings(args: argparse.Namespace, s: Settings) -> list[str]:
    """What is accepted but not emulated: each given option of the WARNED role (in the mode
    --grpc picks), an AutoDeploy backend, the metrics settings, and what merging the YAML file
    had to say."""
    out = [f"{o.name} is accepted but not emulated: it changes nothing here"
           for o in OPTIONS if o.role_in(args.grpc) == WARNED and is_given(getattr(args, o.dest))]
    if s.fields["backend"] == "_autodeploy":
        out.append("backend _autodeploy is served as the PyTorch backend: AutoDeploy's graph "
                   "transformations are not emulated")
    return out + _metrics_warnings(args, s) + s.warnings


def _metrics_warnings(args: argparse.Namespace, s: Settings) -> list[str]:
    """trtllm-serve mounts /prometheus/metrics with return_perf_metrics and fills /metrics'
    iteration stats with enable_iter_perf_stats; the pod's --enable-metrics does both, so one
    alone gets the other too. With --grpc neither has an HTTP server to change."""
    given = [k for k in METRICS if s.fields[k]]
    if args.grpc:
        return [f"{', '.join(s.label(k) for k in given)}: no effect with --grpc (TensorRT-LLM's "
                "gRPC server has no HTTP routes; the pod's HTTP port serves doppelchip's "
                "vLLM-compatible /metrics)"] if given else []
    if given == ["enable_iter_perf_stats"]:
        return [f"{s.label(given[0])} without return_perf_metrics: /prometheus/metrics (the "
                "trtllm_ series) is mounted as well; doppelchip serves both together"]
    if given == ["return_perf_metrics"]:
        return [f"{s.label(given[0])} without enable_iter_perf_stats: /metrics lists the "
                "iteration stats as well (TensorRT-LLM answers []); doppelchip serves both "
                "together"]
    return []


def cmd_trtllm_serve(args: argparse.Namespace) -> int:
    """Translate, then serve the pod (exit status 2 and one `error:` line when it cannot)."""
    try:
        argv, warnings = translate(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # TensorRT-LLM starts with the KV cache that fits (a request is capped by it)
    return serve_pod(PROG, argv, warnings, args.model, fit_model_len=False)
