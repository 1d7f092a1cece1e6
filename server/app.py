"""The server's lifecycle: start the fleet and the gRPC + metrics servers; drain on a signal.

Shutdown (SIGTERM/SIGINT, or `drain()`): health flips to NOT_SERVING, new Generate calls get
UNAVAILABLE, in-flight streams run to completion for up to `drain_grace_s`, whatever is left is
aborted (its stream ends with finish reason abort), then the gRPC server stops.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from doppelchip.v1 import inference_pb2 as pb
from doppelchip.v1 import inference_pb2_grpc as pb_grpc
from server.config import FleetConfig
from server.fleet import Fleet
from server.metrics import start_metrics_server
from server.servicer import InferenceServicer
from server.vllm_servicer import SERVICE_NAME as VLLM_SERVICE_NAME
from server.vllm_servicer import VllmEngineServicer, add_to_server

log = logging.getLogger("doppelchip.server")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Inference"].full_name


class App:
    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.fleet = Fleet(config)
        self.servicer = InferenceServicer(self.fleet)
        self.vllm = VllmEngineServicer(self.fleet.get(config.vllm_engine_deployment))
        self.health = health.aio.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.port = 0
        self.metrics_port = 0
        self._metrics = None
        self._stopped = asyncio.Event()
        self._vllm_health: asyncio.Task[None] | None = None

    async def start(self) -> None:
        cfg = self.config.server
        self.server = grpc.aio.server()
        pb_grpc.add_InferenceServicer_to_server(self.servicer, self.server)
        add_to_server(self.vllm, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, VLLM_SERVICE_NAME,
             health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            self.server,
        )
        self.port = self.server.add_insecure_port(f"{cfg.host}:{cfg.port}")
        if self.port == 0:
            raise OSError(f"cannot bind gRPC to {cfg.host}:{cfg.port}")
        self._metrics = start_metrics_server(self.fleet, cfg.host, cfg.metrics_port)
        self.metrics_port = self._metrics.server_port
        self.servicer.metrics_port = self.metrics_port
        await self.fleet.start()
        await self.server.start()
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._vllm_health = asyncio.create_task(self._serve_vllm_when_ready())
        log.info(
            "serving %d deployments on %s:%d (metrics on :%d/metrics), default %s",
            len(self.fleet.engines), cfg.host, self.port, self.metrics_port,
            self.fleet.default_name,
        )

    async def _serve_vllm_when_ready(self) -> None:
        """The standard health of the VllmEngine service follows its deployment: NOT_SERVING
        until it is ready (a cold deployment is compiling), SERVING after."""
        await self.health.set(VLLM_SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
        until_ready = getattr(self.vllm.engine, "until_ready", None)
        if until_ready is not None:
            await until_ready()
        if not self.servicer.draining:
            await self.health.set(VLLM_SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)

    async def drain(self, grace_s: float | None = None) -> None:
        """Stop taking work, let in-flight streams finish (up to the grace), then stop."""
        if self._stopped.is_set() or self.server is None:
            return
        grace = self.config.server.drain_grace_s if grace_s is None else grace_s
        self.servicer.draining = self.vllm.draining = True
        if self._vllm_health is not None:
            self._vllm_health.cancel()
        await self.health.enter_graceful_shutdown()
        log.info("draining: %d requests in flight, grace %.1fs", self.fleet.num_unfinished(), grace)
        idle = [asyncio.create_task(e.until_idle()) for e in self.fleet.engines.values()]
        _done, pending = await asyncio.wait(idle, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("grace expired: aborting %d requests", self.fleet.num_unfinished())
        await self.fleet.stop()  # aborts what is left; those streams end with finish=abort
        await self.server.stop(1.0)
        if self._metrics is not None:
            self._metrics.shutdown()
            self._metrics.server_close()
        self._stopped.set()
        log.info("stopped")

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


async def serve(config: FleetConfig) -> int:
    """Run until SIGTERM/SIGINT, drain, return the exit status."""
    app = App(config)
    await app.start()
    host = config.server.host
    # Always printed (whatever the log level) so scripts can find ports chosen with port 0.
    print(f"doppelchip: listening on {host}:{app.port} (metrics on {host}:{app.metrics_port})",
          file=sys.stderr, flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("signal received")
    await app.drain()
    return 0


def run(config: FleetConfig) -> int:
    """Serve on the configured event loop. `auto` is uvloop: benchmarks/RESULTS.md measured it
    slightly faster than asyncio for grpc.aio streaming and unary calls here."""
    loop_kind = config.server.event_loop
    if loop_kind in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if loop_kind == "uvloop":
                raise
        else:
            return uvloop.run(serve(config))
    return asyncio.run(serve(config))
