"""A front-end process's entry point: serve gRPC and HTTP until SIGTERM, then drain and exit 0."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from dataclasses import dataclass

import zmq

from server.config import FleetConfig
from server.ipc import lifeline
from server.ipc import messages as m
from server.ipc.deployment import DeploymentInfo
from server.ipc.paths import RunDir
from server.logsetup import configure_logging

log = logging.getLogger("doppelchip.frontend")


@dataclass(frozen=True)
class FrontendSpec:
    """Everything a front-end process needs, passed by the supervisor at spawn."""

    frontend: int
    config: FleetConfig
    infos: list[list[DeploymentInfo]]  # per deployment, per rank
    run_dir: str
    wall0: float
    port: int  # the gRPC port (0: any free port, with one front end only)
    http_port: int  # the HTTP (and /metrics) port, always concrete: the supervisor reserved it
    reuse_port: bool  # several front ends share the ports
    num_frontends: int  # all of the server's front ends (/metrics shows every one)
    log_level: str
    supervisor_pid: int = 0  # exit when it is gone (server.ipc.lifeline); 0: no lifeline


def frontend_main(spec: FrontendSpec) -> None:
    configure_logging(spec.log_level, f"frontend[{spec.frontend}]")
    if spec.supervisor_pid:
        lifeline.exit_with(spec.supervisor_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the supervisor, which drains
    kind = spec.config.server.event_loop
    if kind in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise
        else:
            uvloop.run(_serve(spec))
            return
    asyncio.run(_serve(spec))


async def _serve(spec: FrontendSpec) -> None:
    from server.app import FrontendApp

    run = RunDir(spec.run_dir)
    app = FrontendApp(spec.config, spec.infos, frontend=spec.frontend, run_dir=run,
                      wall0=spec.wall0, port=spec.port, http_port=spec.http_port,
                      reuse_port=spec.reuse_port, num_frontends=spec.num_frontends,
                      supervisor_pid=spec.supervisor_pid)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await app.start()
    except (OSError, RuntimeError) as e:
        _hello(run, spec.frontend, 0, str(e))
        return
    _hello(run, spec.frontend, app.port, "")
    # As vLLM's API server does after start-up: everything built so far (tokenizer, FastAPI,
    # protobuf descriptors) leaves the collector's generations, so a full collection under
    # load walks only what requests allocate (fewer, shorter pauses of the event loop).
    gc.collect()
    gc.freeze()
    log.info("front end %d up: pid %d", spec.frontend, os.getpid())
    await stop.wait()
    await app.drain()


def _hello(run: RunDir, frontend: int, port: int, error: str) -> None:
    ctx = zmq.Context()  # its own: term() below waits until the hello is out of the process
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(run.supervisor_input())
    sock.send(m.encode(m.FrontendHello(frontend, os.getpid(), port, error)))
    sock.close()
    ctx.term()
