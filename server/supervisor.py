"""`doppelchip serve`: the supervisor process — engine and front-end processes, ports, restarts,
drain.

Lifecycle:
1. claim the public ports (an exclusive per-port lock; a port in use is a one-line error) and
   reserve the HTTP port (port 0 becomes one concrete port every front end then binds);
2. start one engine-core process per deployment and data-parallel rank; each builds its core
   and says hello with its `DeploymentInfo` (an unplaceable one says why and exits);
3. start `api_server_count` front-end processes sharing the gRPC and HTTP ports (each serves
   gRPC, the OpenAI-compatible HTTP API and `/metrics`); once all are up, print
   `listening on HOST:PORT (HTTP and metrics on HOST:HTTP_PORT)` — the ports open only when
   every engine is up;
4. watch the children: an engine that dies marks its deployment FAILED (its requests end with
   an error, the others keep serving) and is restarted after the back-off, paying its cold
   start; a front end that dies has its requests aborted in the engines and is restarted;
5. SIGTERM/SIGINT: the front ends drain (health NOT_SERVING, new calls UNAVAILABLE, in-flight
   streams finish or are aborted at the grace), then the engines stop; exit 0.

Children are forked from a forkserver started before any thread or socket exists here, with
the heavy modules preloaded, so starting (and restarting) one is fast and fork-safe.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import sys
import time
from dataclasses import dataclass

import msgspec
import zmq

from server import forkserver
from server.config import FleetConfig
from server.engine.kv_events_config import is_loopback, with_port_offsets
from server.engine.tokenizer import get_tokenizer
from server.engine_proc.info import failed_info
from server.engine_proc.main import EngineSpec, engine_main
from server.fleet import choose_default
from server.frontend.main import FrontendSpec, frontend_main
from server.ipc import messages as m
from server.ipc.deployment import DeploymentInfo
from server.ipc.paths import RunDir
from server.ports import PortInUse, claim, claim_server_ports
from server.stats.buckets import parse_custom_histogram_buckets
from server.supervisor_engines import EngineSlot, crash_message
from server.supervisor_stop import stop_children
from server.supervisor_watch import Watcher

log = logging.getLogger("doppelchip.server")

START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ServeOptions:
    log_level: str = "info"
    check_integrity: bool = False  # engines run the scheduler's check_integrity() when idle


def default_api_server_count() -> int:
    """One front end per two cores beyond the first two (the client and the engines need the
    rest), at least one: 1 on 2 cores, 2 on 4, 4 on 8."""
    return max(1, ((os.cpu_count() or 1) - 1) // 2)


class Supervisor:
    def __init__(self, config: FleetConfig, options: ServeOptions) -> None:
        self.config, self.options = config, options
        cfg = config.server
        ft = any(d.recovery_timeout_s() is not None for d in config.deployments)
        self.num_frontends = cfg.api_server_count or (1 if ft else default_api_server_count())
        self.run_dir = RunDir.create()
        self.wall0 = time.monotonic()
        self.mp = forkserver.context()
        self.engines: dict[tuple[int, int], EngineSlot] = {}
        self.frontends: dict[int, mp.process.BaseProcess] = {}
        self.infos: list[list[DeploymentInfo | None]] = [
            [None] * d.local_ranks for d in config.deployments]
        self.stopping = False
        self._locks: list = []
        self.port = cfg.port
        self.http_port = cfg.http_port

    # ---- start-up ---------------------------------------------------------------------------
    async def run(self) -> int:
        cfg = self.config.server
        loop = asyncio.get_running_loop()
        try:
            self._locks, self.port, self.http_port = claim_server_ports(
                cfg.host, cfg.port, cfg.http_port, self.num_frontends)
        except PortInUse as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            return 1
        ctx = zmq.Context()
        inbox = ctx.socket(zmq.PULL)
        inbox.bind(self.run_dir.supervisor_input())
        self.inbox, self.ctx = inbox, ctx
        self.to_frontends = []
        deployments = with_port_offsets(self.config.deployments)  # KV events (issue 13)
        if self.config.server.engine_api == "sglang":  # SGLang's events (sglang_wire.py)
            deployments = tuple(dataclasses.replace(d, kv_events_wire="sglang")
                                for d in deployments)
        for d, dep in enumerate(deployments):
            for rank in range(dep.local_ranks):
                slot = EngineSlot(d, rank, dep)
                self.engines[(d, rank)] = slot
                self._start_engine(slot, cold=dep.start == "cold")
        if not await self._await_engines():
            return 1
        infos = [[i for i in ranks if i is not None] for ranks in self.infos]
        self.frontend_infos = infos
        self._choose_default(infos)
        for i in range(self.num_frontends):
            self._start_frontend(i)
        if not await self._await_frontends():
            await self._stop_all()
            return 1
        for i in range(self.num_frontends):
            s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(self.run_dir.frontend_input(i))
            self.to_frontends.append(s)
        log.info("serving %d deployments on %s:%d with %d front end(s) (HTTP on :%d)",
                 len(self.config.deployments), cfg.host, self.port, self.num_frontends,
                 self.http_port)
        # Always printed (whatever the log level) so scripts can find ports chosen with 0.
        print(f"doppelchip: listening on {cfg.host}:{self.port} "
              f"(HTTP and metrics on {cfg.host}:{self.http_port})", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        watcher = Watcher(self)
        watcher.start()
        await stop.wait()
        log.info("signal received: draining")
        self.stopping = True
        watcher.stop()
        await self._stop_all()
        # Drained: a repeated SIGTERM (an orchestrator's, a test's) must not turn exit 0 into
        # death by signal while the interpreter winds down (closing the loop would restore the
        # default action).
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)
        return 0

    def _choose_default(self, infos: list[list[DeploymentInfo]]) -> None:
        """Never a FAILED default (server.fleet.choose_default); the log says which and why.
        The front ends get the config with the chosen name."""
        configured = self.config.default_deployment
        placed = [(d.name, bool(ranks) and all(i.placed for i in ranks),
                   "; ".join(i.failure for i in ranks if i.failure))
                  for d, ranks in zip(self.config.deployments, infos, strict=True)]
        name, why = choose_default(configured, bool(self.config.server.default_deployment),
                                   placed)
        if name != configured:
            self.config = self.config.with_server(default_deployment=name)
            log.warning("default deployment: %s (%s)", name, why)
        else:
            log.info("default deployment: %s (%s)", name, why)

    def _engine_spec(self, slot: EngineSlot, cold: bool) -> EngineSpec:
        cfg = self.config.server
        last = slot.info if slot.epoch else None  # a restart: what the last incarnation bound
        pinned = ((last.kv_events_endpoint, last.kv_events_replay_endpoint)
                  if last is not None else ("", ""))
        return EngineSpec(deployment=slot.deployment, rank=slot.rank, epoch=slot.epoch,
                          options=slot.options, run_dir=str(self.run_dir.path),
                          num_frontends=self.num_frontends, time_scale=cfg.time_scale,
                          wall0=self.wall0, cold=cold, log_level=self.options.log_level,
                          check_integrity=self.options.check_integrity,
                          histogram_buckets=self._histogram_buckets(),
                          profiler_config=cfg.profiler_config, pod=cfg.pod,
                          exposed=not is_loopback(cfg.host), supervisor_pid=os.getpid(),
                          kv_events_pinned=pinned)

    def _histogram_buckets(self) -> tuple[tuple[str, tuple[float, ...]], ...]:
        """The server's --custom-histogram-buckets, as every engine's info carries them."""
        return tuple(parse_custom_histogram_buckets(
            self.config.server.custom_histogram_buckets).items())

    def _start_engine(self, slot: EngineSlot, cold: bool) -> None:
        proc = self.mp.Process(target=engine_main, args=(self._engine_spec(slot, cold),),
                               name=f"engine-{slot.options.name}-{slot.rank}", daemon=False)
        proc.start()
        slot.process = proc

    def _start_frontend(self, i: int) -> None:
        spec = FrontendSpec(frontend=i, config=self.config, infos=self.frontend_infos,
                            run_dir=str(self.run_dir.path), wall0=self.wall0,
                            port=self.port, http_port=self.http_port,
                            reuse_port=self.num_frontends > 1,
                            num_frontends=self.num_frontends, log_level=self.options.log_level,
                            supervisor_pid=os.getpid())
        proc = self.mp.Process(target=frontend_main, args=(spec,), name=f"frontend-{i}",
                               daemon=False)
        proc.start()
        self.frontends[i] = proc

    async def _recv(self, timeout: float) -> object | None:
        """The next message to the supervisor, or None after `timeout` seconds (start-up
        only; afterwards the Watcher reads the inbox from the event loop)."""
        def poll() -> bytes | None:
            return self.inbox.recv() if self.inbox.poll(int(timeout * 1000)) else None

        raw = await asyncio.to_thread(poll)
        return m.to_supervisor(raw) if raw is not None else None

    async def _await_engines(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        waiting = set(self.engines)

        def take(msg: object) -> None:
            if isinstance(msg, m.EngineHello):
                key = (msg.deployment, msg.rank)
                waiting.discard(key)
                self.infos[msg.deployment][msg.rank] = msg.info
                self.engines[key].hello(msg)

        while waiting:
            if time.monotonic() > deadline:
                print("error: engine processes did not start in time: "
                      + ", ".join(self.engines[k].options.name for k in waiting),
                      file=sys.stderr, flush=True)
                return False
            if (msg := await self._recv(0.2)) is not None:
                take(msg)
                continue
            for key in [k for k in waiting if not self.engines[k].process.is_alive()]:
                while key in waiting and (msg := await self._recv(0.5)) is not None:
                    take(msg)  # a hello sent just before the process exited, in transit
                if key in waiting:  # died before saying hello
                    waiting.discard(key)
                    self._fail_startup(self.engines[key])
        return True

    def _fail_startup(self, slot: EngineSlot) -> None:
        """An engine that died before its hello: FAILED with the reason, the rest serve."""
        why = crash_message(slot.process.exitcode if slot.process else None)
        info = msgspec.structs.replace(
            failed_info(slot.options, slot.rank, f"engine process died at start-up: {why}",
                        get_tokenizer().vocab_size), histogram_buckets=self._histogram_buckets())
        self.infos[slot.deployment][slot.rank] = info
        slot.mark_failed(self.run_dir, info, info.failure)

    async def _await_frontends(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        waiting = set(self.frontends)
        while waiting:
            if time.monotonic() > deadline:
                print("error: front-end processes did not start in time", file=sys.stderr)
                return False
            for i in list(waiting):
                if not self.frontends[i].is_alive():
                    print(f"error: front end {i} exited at start-up "
                          f"({crash_message(self.frontends[i].exitcode)})", file=sys.stderr)
                    return False
            msg = await self._recv(0.2)
            if isinstance(msg, m.FrontendHello):
                if msg.error:
                    print(f"error: {msg.error}", file=sys.stderr, flush=True)
                    return False
                waiting.discard(msg.frontend)
                if self.num_frontends == 1 and not self.config.server.port:
                    self.port = msg.port
                    self._locks.append(claim(self.config.server.host, self.port, "gRPC"))
            elif isinstance(msg, m.EngineHello):
                self.engines[(msg.deployment, msg.rank)].hello(msg)
        return True

    # ---- shutdown ---------------------------------------------------------------------------
    async def _stop_all(self) -> None:
        self.stopping = True
        await stop_children(self)


def serve(config: FleetConfig, options: ServeOptions) -> int:
    from server.logsetup import configure_logging

    configure_logging(options.log_level, "supervisor")
    return asyncio.run(Supervisor(config, options).run())
