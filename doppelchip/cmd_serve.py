"""`doppelchip serve`: parse the flags, hand the fleet to the supervisor."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from doppelchip.serve_security import add_security_args, security_overrides, with_env_api_key


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a fleet of emulated deployments over gRPC and OpenAI HTTP",
        description="Serve a fleet (the built-in default unless --config) over gRPC and an "
        "OpenAI-compatible HTTP API (vLLM's routes) with Prometheus metrics on the HTTP port. "
        "Each deployment's engine core runs in a process of its own; front-end processes "
        "share the public ports. SIGTERM/SIGINT drains and exits 0.")
    p.add_argument("--config", metavar="FILE", help="fleet TOML file (default: built-in fleet)")
    p.add_argument("--host", help="address to bind gRPC and HTTP to (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="gRPC port (default 50051; 0 picks a free port)")
    p.add_argument("--http-port", "--metrics-port", dest="http_port", type=int,
                   help="OpenAI-compatible HTTP port, also serving Prometheus /metrics, as "
                   "vLLM's --port (default 8000; 0 picks a free port; --metrics-port is a "
                   "permanent alias)")
    p.add_argument("--time-scale", type=float,
                   help="wall seconds per emulated second (1.0 true speed; 0.01 is 100x faster)")
    p.add_argument("--default-deployment", metavar="NAME",
                   help="deployment used when a request names none")
    p.add_argument("--drain-grace", type=float, metavar="SECONDS",
                   help="on shutdown, how long in-flight streams may run before being aborted")
    p.add_argument("--event-loop", choices=["auto", "uvloop", "asyncio"],
                   help="the front ends' event loop (auto: the measured faster one)")
    p.add_argument("--vllm-engine-deployment", metavar="NAME",
                   help="deployment the vLLM engine gRPC service (vllm.grpc.engine.VllmEngine, "
                   "what the smg gateway speaks) fronts on this port (default: the default "
                   "deployment)")
    p.add_argument("--api-server-count", type=int, metavar="N",
                   help="front-end processes sharing the ports, as vLLM's flag (default: one "
                   "per two cores beyond the first two, at least 1)")
    p.add_argument("--stream-interval", type=int, metavar="N",
                   help="send every N tokens of a stream in one message, as vLLM's flag (the "
                   "first tokens and the finish go at once; default 1; a deployment's "
                   "stream_interval wins)")
    p.add_argument("--engine-restart-backoff", type=float, metavar="SECONDS",
                   help="a crashed engine process restarts after this, doubling for repeated "
                   "crashes within a minute (default 2)")
    p.add_argument("--check-integrity", action="store_true",
                   help="engines check their KV pool and queue invariants each time they go "
                   "idle (for tests: a broken invariant crashes the engine, loudly)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="logging verbosity (default info)")
    p.add_argument("--show-hidden-metrics-for-version", metavar="VERSION",
                   help="as vLLM's flag: 0.10 also exports vLLM 0.11.x's deprecated names "
                   "(vllm:gpu_cache_usage_perc, vllm:gpu_prefix_cache_*), which the "
                   "production-stack router reads")
    p.add_argument("--enable-server-load-tracking", action="store_true", default=None,
                   help="as vLLM's flag: GET /load answers {\"server_load\": N}, the completions "
                   "and chat requests this front end has in flight (0 without the flag)")
    p.add_argument("--enable-scale-out", action="store_true", default=None,
                   help="as vLLM's flag: serve the render routes (/v1/chat/completions/render, "
                   "/v1/completions/render, /v1/messages/render) and token-in/token-out "
                   "generation (/inference/v1/generate); 403 without it")
    p.add_argument("--custom-histogram-buckets", metavar="JSON",
                   help="as vLLM's flag: replace a bucket family's bounds in every vllm: "
                   "histogram of it, e.g. '{\"time_to_first_token\": [0.05, 0.1, 0.5]}' "
                   "(families: request_latency, time_to_first_token, inter_token_latency, "
                   "iteration_tokens, request_params_n, request_num_preemptions, "
                   "request_tokens, kv_cache_residency)")
    p.add_argument("--enable-auto-tool-choice", action="store_true", default=None,
                   help="accepted as vLLM's flag: tool_choice \"auto\" needs no flag here")
    p.add_argument("--tool-call-parser", metavar="NAME",
                   help="accepted as vLLM's flag (the calls are written under a schema, no "
                   "parser is needed); exports vllm:tool_call_parser_invocations_total")
    p.add_argument("--enable-tokenizer-info-endpoint", action="store_true", default=None,
                   help="as vLLM's flag: serve GET /tokenizer_info, the tokenizer's "
                   "configuration and chat template (404 without it)")
    p.add_argument("--enable-force-include-usage", action="store_true", default=None,
                   help="as vLLM's flag: every streamed completion and chat answer carries its "
                   "usage so far on each chunk and a usage chunk at its end, whatever its "
                   "stream_options")
    p.add_argument("--enable-per-request-metrics", action="store_true", default=None,
                   help="as vLLM's flag: a completions or chat answer (one prompt, n = 1) "
                   "carries `metrics`: its queue time, TTFT, ITL on the emulated timeline")
    p.add_argument("--response-role", metavar="ROLE",
                   help="as vLLM's flag: a chat answer's role when the request adds a "
                   "generation prompt (default assistant)")
    p.add_argument("--return-tokens-as-token-ids", action="store_true", default=None,
                   help="as vLLM's flag: logprobs name tokens 'token_id:N' unless a request "
                   "sets return_tokens_as_token_ids itself")
    p.add_argument("--disable-log-stats", action="store_true", default=None,
                   help="as vLLM's flag: keep no statistics, so /metrics carries none of the "
                   "engine's vllm: series (routers and autoscalers reading them see nothing)")
    p.add_argument("--profiler-config", metavar="JSON",
                   help="as vLLM's flag: '{\"profiler\": \"torch\", \"torch_profiler_dir\": "
                   "\"DIR\"}' serves /start_profile and /stop_profile, which write each engine "
                   "core's emulated steps as a trace (Perfetto, TensorBoard) into DIR")
    add_security_args(p)  # (doppelchip/serve_security.py)
    from doppelchip.sim_flags import add_deployment_args

    shaping = add_deployment_args(p, verb="serve alone, as a vLLM pod", with_config=False)
    first = len(p._actions)
    pod = p.add_argument_group("pod mode (with --deployment or --chip/--engine/--model/--quant)")
    pod.add_argument("--served-model-name", nargs="+", metavar="NAME",
                     help="the model name(s) clients send, as vLLM's flag; the first is the "
                     "model_name label of every vllm: series (default: the catalogue model id)")
    pod.add_argument("--data-parallel-size", type=int, metavar="N",
                     help="N engine cores, as vLLM's flag: each a full copy on its own chips, "
                     "or, for a MoE model on vLLM, one expert-parallel group whose experts "
                     "are sharded over every rank's chips; the engine label is 0..N-1")
    pod.add_argument("--data-parallel-size-local", type=int, metavar="L",
                     help="run L of the N ranks here (vLLM's hybrid and external load "
                     "balancing: one pod per node or per rank); default all")
    pod.add_argument("--data-parallel-start-rank", type=int, metavar="S",
                     help="the first rank run here (the engine label of the first: S); "
                     "default 0")
    pod.add_argument("--http-api", choices=["vllm", "sglang", "trtllm"],
                     help="the server the pod imitates: vllm (default: vLLM's OpenAI server; "
                     "vllm.grpc.engine on the gRPC port), sglang (SGLang's server: /generate, "
                     "/model_info, /server_info, /v1/loads, /flush_cache, the OpenAI routes, "
                     "sglang: metrics; sglang.grpc.scheduler on the gRPC port; docs/SGLANG.md) "
                     "or trtllm (trtllm-serve's OpenAI server: /health, /version, the iteration "
                     "stats on /metrics, trtllm_ series on /prometheus/metrics; "
                     "trtllm.TrtllmService on the gRPC port; docs/TRTLLM.md)")
    pod.add_argument("--grpc-api", choices=["vllm", "sglang", "trtllm", "mlx"],
                     help="the engine service on the gRPC port (default: the --http-api's): "
                     "trtllm serves TensorRT-LLM's trtllm.TrtllmService (`trtllm-serve "
                     "--grpc`) in place of vllm.grpc.engine, on a vLLM-API pod (docs/TRTLLM.md); "
                     "mlx serves MLX's mlx.grpc.engine.MlxEngine (smg's MLX servicer) there "
                     "(docs/MLX.md)")
    pod.add_argument("--enable-metrics", action="store_true", default=None,
                     help="as SGLang's flag, on an --http-api sglang pod: serve /metrics with "
                     "SGLang's sglang: series (without it SGLang mounts no /metrics); on an "
                     "--http-api trtllm pod, TensorRT-LLM's return_perf_metrics and "
                     "enable_iter_perf_stats: /prometheus/metrics and the iteration stats")
    pod.add_argument("--enable-expert-parallel", action="store_true",
                     help="as vLLM's flag: experts spread over every chip of a stage "
                     "(--ep = --count / --pp, or --tp without --count)")
    pod_only = shaping + tuple((a.dest, a.option_strings[0]) for a in p._actions[first:])
    p.set_defaults(func=cmd_serve, pod_only=pod_only)


def cmd_serve(args: argparse.Namespace) -> int:
    from server import forkserver

    forkserver.start_early()  # it preloads on the other core while the lines below run
    from server.config import ConfigError, kv_events_problem, load_fleet
    from server.engine_proc.sentinel import fault_tolerance_problem
    from server.server_config import server_problem
    from server.stats.buckets import parse_custom_histogram_buckets
    from server.supervisor import ServeOptions, serve

    try:
        fleet = pod_fleet(args, load_fleet(args.config)).with_server(
            host=args.host, port=args.port, http_port=args.http_port,
            time_scale=args.time_scale, default_deployment=args.default_deployment,
            drain_grace_s=args.drain_grace, event_loop=args.event_loop,
            vllm_engine_deployment=args.vllm_engine_deployment,
            api_server_count=args.api_server_count, stream_interval=args.stream_interval,
            engine_restart_backoff_s=args.engine_restart_backoff,
            show_hidden_metrics_for_version=args.show_hidden_metrics_for_version,
            enable_server_load_tracking=args.enable_server_load_tracking,
            enable_scale_out=args.enable_scale_out,
            custom_histogram_buckets=args.custom_histogram_buckets,
            profiler_config=args.profiler_config,
            enable_tokenizer_info_endpoint=args.enable_tokenizer_info_endpoint,
            enable_force_include_usage=args.enable_force_include_usage,
            enable_per_request_metrics=args.enable_per_request_metrics,
            disable_log_stats=args.disable_log_stats, response_role=args.response_role,
            return_tokens_as_token_ids=args.return_tokens_as_token_ids,
            enable_auto_tool_choice=args.enable_auto_tool_choice,
            tool_call_parser=args.tool_call_parser,
            http_api=args.http_api, grpc_api=args.grpc_api,
            enable_metrics=args.enable_metrics,
            **security_overrides(args),
        )
        fleet = with_env_api_key(fleet, os.environ)
        problem = (server_problem(fleet.server) or kv_events_problem(fleet)  # --host applied
                   or fault_tolerance_problem(fleet))
        if problem:
            raise ConfigError(problem)
        parse_custom_histogram_buckets(fleet.server.custom_histogram_buckets)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    s = fleet.server
    checks = ((s.time_scale <= 0, "--time-scale must be > 0"),
              (s.api_server_count < 0, "--api-server-count must be >= 0"),
              (s.stream_interval < 1, "--stream-interval must be >= 1"),
              (s.engine_restart_backoff_s < 0, "--engine-restart-backoff must be >= 0"))
    for bad, message in checks:
        if bad:
            print(f"error: {message}", file=sys.stderr)
            return 2
    names = {d.name for d in fleet.deployments}
    if fleet.default_deployment not in names:
        print(f"error: unknown default deployment {fleet.default_deployment!r}", file=sys.stderr)
        return 2
    if fleet.vllm_engine_deployment not in names:
        print(f"error: unknown --vllm-engine-deployment {fleet.vllm_engine_deployment!r}",
              file=sys.stderr)
        return 2
    return serve(fleet, ServeOptions(log_level=args.log_level,
                                     check_integrity=args.check_integrity))


def pod_fleet(args: argparse.Namespace, fleet):
    """The fleet to serve: as configured, or (pod mode) the one deployment `--deployment` or
    the catalogue flags name, with the pod's served names and data-parallel size. Without pod
    mode a flag that shapes one deployment (`args.pod_only`: every deployment, fault and pod
    flag) is refused, not ignored: a fleet file sets it per deployment."""
    import dataclasses

    from sim.sim_args import options_from_args
    from sim.simulation import SimulationError

    catalogue = (args.chip, args.engine, args.model, args.quant)
    if not args.deployment and not any(catalogue):
        used = [flag for dest, flag in args.pod_only
                if getattr(args, dest) is not None and getattr(args, dest) is not False]
        if used:
            raise ValueError(f"{', '.join(used)} {'needs' if len(used) == 1 else 'need'} pod "
                             "mode (--deployment NAME, or --chip --engine --model --quant)")
        return fleet
    try:
        options = options_from_args(args)
    except SimulationError as e:
        raise ValueError(str(e)) from e
    if any(catalogue) and not args.deployment:  # named after the flags
        options = dataclasses.replace(
            options, name=f"{options.engine}-{options.chip}-{options.model}-{options.quant}")
    ep = options.ep
    if args.enable_expert_parallel and ep is None:  # a rank's chips; data-parallel ranks of
        # a MoE model join one expert group in vLLM with or without this flag (place_rank)
        ep = options.count // (options.pp or 1) if options.count else options.tp or 1
    options = dataclasses.replace(
        options, ep=ep,
        served_model_name=tuple(args.served_model_name or options.served_model_name),
        model_path=getattr(args, "model_path", "") or options.model_path,  # `vllm serve REPO`
        data_parallel_size=args.data_parallel_size or options.data_parallel_size,
        data_parallel_size_local=args.data_parallel_size_local,
        data_parallel_start_rank=args.data_parallel_start_rank or 0)
    if problem := options.rank_problem():
        raise ValueError(problem)
    server = dataclasses.replace(fleet.server, default_deployment=options.name,
                                 vllm_engine_deployment=options.name, pod=True)
    return dataclasses.replace(fleet, server=server, deployments=(options,))
