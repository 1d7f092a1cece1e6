"""One front-end process's application: the deployments' clients, the receiver of engine
messages, the gRPC server (Inference, the engine service smg fronts — VllmEngine,
SglangScheduler on an SGLang pod or TrtllmService on a TensorRT-LLM one — health,
reflection), the OpenAI-compatible HTTP server with `/metrics` (`server.http`), and their
drain.

Health, reflection and ListDeployments are answered here from local state and the engines'
stats files, never by waiting on a busy engine. Drain (SIGTERM from the supervisor): gRPC
health flips to NOT_SERVING and HTTP `/health` to 503, new calls get UNAVAILABLE / 503,
in-flight streams (both protocols) run to completion for up to `drain_grace_s`, whatever is
left is aborted (its stream ends with finish reason abort), then both servers stop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import grpc
import zmq
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from doppelchip.v1 import inference_pb2 as pb
from server import wire
from server.auth import ApiKeys
from server.config import FleetConfig
from server.engine.clock import Timeline
from server.engine.profiler_config import ProfilerConfig
from server.engine.tokenizer import get_tokenizer
from server.fleet import Fleet
from server.frontend.deployment import DeploymentClient
from server.frontend.faults import RequestFaults, quiet_http_cuts
from server.frontend.pacing import LoopPacer
from server.frontend.receiver import Receiver
from server.frontend.stats import FrontendStats
from server.grpc_server import add_port, build_server
from server.http.app import build_app
from server.http.metrics import enable_multiprocess
from server.http.parser_metrics import ToolParserMetrics
from server.http.responses_store import ResponseStore
from server.http.server import HttpServer, ListenerOptions
from server.http.sglang.app import build_sglang_app
from server.http.state import HttpState
from server.http.trtllm.app import build_trtllm_app
from server.ipc.deployment import DeploymentInfo
from server.ipc.paths import RunDir
from server.metrics import MetricsView
from server.mlx_servicer import MLX_SERVICE, MlxEngineServicer
from server.servicer import InferenceServicer
from server.sglang_servicer import SGLANG_SERVICE, SglangSchedulerServicer
from server.stats.buckets import parse_custom_histogram_buckets
from server.stats.collector import StatsCollector
from server.trtllm_servicer import TRTLLM_SERVICE, TrtllmServiceServicer
from server.vllm_servicer import VLLM_SERVICE, VllmEngineServicer

log = logging.getLogger("doppelchip.server")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Inference"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class FrontendApp:
    def __init__(self, config: FleetConfig, infos: list[list[DeploymentInfo]], *, frontend: int,
                 run_dir: RunDir, wall0: float, port: int, http_port: int,
                 reuse_port: bool, num_frontends: int = 1, supervisor_pid: int = 0) -> None:
        self.config, self.frontend = config, frontend
        cfg = config.server
        self.timeline = Timeline(wall0, cfg.time_scale)
        self.now = self.timeline.now
        self.ctx = zmq.Context()
        self.input = self.ctx.socket(zmq.PULL)
        self.input.setsockopt(zmq.LINGER, 0)
        self.input.bind(run_dir.frontend_input(frontend))
        max_len = max((r.capacity.max_model_len for d in infos for r in d), default=1)
        keys = [(d, r.rank) for d, ranks in enumerate(infos) for r in ranks]
        buckets = parse_custom_histogram_buckets(cfg.custom_histogram_buckets)
        # whose series the pod exports: an SGLang or TensorRT-LLM pod's with --enable-metrics
        series = cfg.http_api if cfg.enable_metrics else "vllm"
        self.stats = FrontendStats(run_dir.frontend_stats(frontend), keys, max(1, max_len),
                                   any(r.faults for d in infos for r in d), buckets, series)
        tokenizer = get_tokenizer()
        tokenizer.warm()  # not at the first request: its TTFT would pay ~0.3 s
        self.pacer = LoopPacer()  # coalescing while this process's event loop is saturated
        self.clients = [
            DeploymentClient(d, ranks, frontend=frontend, run_dir=run_dir, ctx=self.ctx,
                             tokenizer=tokenizer,
                             stream_interval=dep.stream_interval or cfg.stream_interval,
                             clock=self.timeline.now, stats=self.stats, pacer=self.pacer)
            for d, (ranks, dep) in enumerate(zip(infos, config.deployments, strict=True))
        ]
        # --- failure injection (issue 13): server/frontend/faults.py ---
        for client, dep in zip(self.clients, config.deployments, strict=True):
            if dep.failure_injection_rate or dep.fault_stream_cut:
                client.faults = RequestFaults(dep, frontend, client.info.model_name,
                                              self.stats, (client.index, client.info.rank))
            if dep.fault_stream_cut:
                quiet_http_cuts()
        self.fleet = Fleet(self.clients, config.default_deployment)
        self.receiver = Receiver(self.input, self.clients, frontend, self.stats)
        self.servicer = InferenceServicer(self.fleet, cfg.time_scale, http_port, frontend)
        # the engine service smg fronts: an SGLang pod's scheduler, a TensorRT-LLM pod's
        # TrtllmService, an MLX pod's MlxEngine, else vLLM's (docs/SGLANG.md, docs/TRTLLM.md,
        # docs/MLX.md)
        engine = self.fleet.get(config.vllm_engine_deployment)
        self.engine_service, self.engine_descriptor = {
            "sglang": lambda: (SglangSchedulerServicer(engine, cfg.api_key, cfg.enable_metrics),
                               SGLANG_SERVICE),
            "trtllm": lambda: (TrtllmServiceServicer(engine, cfg.api_key), TRTLLM_SERVICE),
            "mlx": lambda: (MlxEngineServicer(engine, cfg.api_key), MLX_SERVICE),
            "vllm": lambda: (VllmEngineServicer(engine, cfg.api_key), VLLM_SERVICE),
        }[cfg.engine_api]()
        self.health = health.aio.HealthServicer()
        self.requested_port, self.reuse_port = port, reuse_port
        self.server: grpc.aio.Server | None = None
        self.port = 0
        enable_multiprocess(run_dir.prometheus_dir())
        collector = StatsCollector(infos, run_dir, num_frontends, cfg.time_scale, wall0,
                                   cfg.show_hidden_metrics_for_version == "0.10", cfg.pod,
                                   buckets, log_stats=not cfg.disable_log_stats, series=series,
                                   pid=supervisor_pid or os.getpid())
        self.http_state = HttpState(self.fleet, tokenizer,
                                    MetricsView(collector, run_dir.prometheus_dir()),
                                    load_tracking=cfg.enable_server_load_tracking,
                                    scale_out=cfg.enable_scale_out,
                                    responses=ResponseStore.from_env(), now=self.now,
                                    profiler=ProfilerConfig.parse(cfg.profiler_config).enabled,
                                    tokenizer_info=cfg.enable_tokenizer_info_endpoint,
                                    checkpoint=any(d.enable_sleep_mode
                                                   for d in config.deployments),
                                    fault_tolerance=any(d.recovery_timeout_s() is not None
                                                        for d in config.deployments),
                                    force_include_usage=cfg.enable_force_include_usage,
                                    sse_keep_alive_s=float(cfg.sse_keep_alive_interval),
                                    per_request_metrics=cfg.enable_per_request_metrics,
                                    response_role=cfg.response_role,
                                    tokens_as_ids=cfg.return_tokens_as_token_ids,
                                    tool_parser=ToolParserMetrics(
                                        c.info.model_name for c in self.clients)
                                    if cfg.tool_call_parser else None,
                                    enable_metrics=cfg.http_api == "vllm" or cfg.enable_metrics,
                                    vllm_api=cfg.http_api == "vllm")
        # Always SO_REUSEPORT: the supervisor holds a reserved socket on the HTTP port.
        build = {"sglang": build_sglang_app, "trtllm": build_trtllm_app,  # docs/SGLANG.md,
                 "vllm": build_app}[cfg.http_api]  # docs/TRTLLM.md
        self.http = HttpServer(build(self.http_state, ApiKeys(cfg.api_key)), cfg.host,
                               http_port, reuse_port=True, options=ListenerOptions.of(cfg))
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        cfg = self.config.server
        self.server = build_server(cfg, self.reuse_port)
        wire.add_service(self.server, self.servicer, pb.DESCRIPTOR.services_by_name["Inference"])
        wire.add_service(self.server, self.engine_service, self.engine_descriptor)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, self.engine_descriptor.full_name,
             health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            self.server,
        )
        self.port = add_port(self.server, cfg, self.requested_port)
        if self.port == 0:
            raise OSError(f"cannot bind gRPC to {cfg.host}:{self.requested_port}")
        await self.http.start()
        self.receiver.start()
        self.pacer.start()
        await self.server.start()
        for service in ("", SERVICE_NAME):
            await self.health.set(service, SERVING)
        await self.health.set(self.engine_descriptor.full_name, NOT_SERVING)
        self._watch = asyncio.create_task(self._follow_engine_deployment())

    async def _follow_engine_deployment(self) -> None:
        """The standard health of the engine service (VllmEngine, SglangScheduler or
        TrtllmService) follows its deployment: SERVING only while it is ready (a cold
        deployment compiles first; a crashed one restarts)."""
        current = NOT_SERVING
        while True:
            wanted = SERVING if self.engine_service.ready() else NOT_SERVING
            if wanted != current:
                await self.health.set(self.engine_descriptor.full_name, wanted)
                current = wanted
            await asyncio.sleep(0.1)

    async def drain(self, grace_s: float | None = None) -> None:
        """Stop taking work, let in-flight streams finish (up to the grace), then stop."""
        if self.server is None:
            return
        grace = self.config.server.drain_grace_s if grace_s is None else grace_s
        self.servicer.draining = self.engine_service.draining = self.http_state.draining = True
        if self._watch is not None:
            self._watch.cancel()
        await self.health.enter_graceful_shutdown()
        log.info("draining: %d requests in flight, grace %.1fs", self.fleet.num_unfinished(),
                 grace)
        deadline = time.monotonic() + grace
        while self.fleet.num_unfinished() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.fleet.num_unfinished():
            log.warning("grace expired: aborting %d requests", self.fleet.num_unfinished())
            for client in self.clients:
                for stream in list(client.streams.values()):
                    client.cancel(stream)
        await asyncio.gather(self.server.stop(1.0), self.http.stop())
        self.receiver.stop()
        self.pacer.stop()
        self.server = None
        log.info("stopped")
