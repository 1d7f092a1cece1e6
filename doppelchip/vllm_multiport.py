"""`vllm serve --data-parallel-multi-port-external-lb` (`-dpm`): vLLM 0.34.0's DP supervisor.

Why it exists: a router or gateway that balances over data-parallel ranks itself (llm-d's
wide expert parallelism, smg) wants one endpoint per rank. With `-dpm`, vLLM starts one
external-load-balanced API server per local rank, rank `start + i` on port `--port + i`, and a
supervisor whose `/health`, `/ready` and `/readyz` (on `--data-parallel-supervisor-port`,
default 9256) answer 200 once every rank's `/health` does (`vllm/entrypoints/launchers/
dp_supervisor.py`). Here each rank is a whole doppelchip pod (the same as `vllm serve
--data-parallel-rank R`), started in a spawned process with the parent's parsed arguments
changed as vLLM changes them; the supervisor is this process.

Lifecycle, as vLLM's: 1. the ranks start; 2. every `--dp-supervisor-probe-interval-s` the
supervisor probes each rank's `/health` (a connection error is retried up to
`--dp-supervisor-probe-failure-threshold` times once ready, a non-200 answer is final);
3. when all answer 200 it is ready and starts its own HTTP server; 4. a rank that exits, or
any failed probe once ready, or SIGTERM/SIGINT, ends it: it forwards the signal (SIGTERM for a
failure) to the ranks still running, waits for them, and kills what is left. A rank whose
supervisor died (SIGKILL) stops itself as if it got SIGTERM.

Where doppelchip differs (docs/VLLM_SERVE.md): the ranks' gRPC servers take free ports (vLLM's
have none, and one default port cannot serve two ranks); the supervisor binds `--host` or
127.0.0.1, not every interface; it exits with status 1 when a rank failed (vLLM returns 0);
a rank gets 15 s plus `--shutdown-timeout` to stop (vLLM: 5 s), as a pod's engine processes
stop after its front ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import multiprocessing
import multiprocessing.connection
import os
import signal
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from multiprocessing.process import BaseProcess

from server.http.server import HttpServer, ListenerOptions

EXIT_GRACE_S = 15.0
PREFIX = "doppelchip vllm serve: "


def start_rank(args: argparse.Namespace) -> int:
    """The first rank this node's supervisor runs: `--data-parallel-start-rank`, else
    node rank x local ranks (vLLM's `infer_multi_port_external_lb_start_rank`)."""
    if args.data_parallel_start_rank is not None:
        return args.data_parallel_start_rank
    return (args.node_rank or 0) * (args.data_parallel_size_local or 0)


def validate(args: argparse.Namespace) -> None:
    """vLLM's refusals of a multi-port launch (`validate_multi_port_external_lb_args`, and
    `validate_grpc_port_arg`'s for `--grpc-port`), in its words: ValueError."""
    if args.grpc:
        raise ValueError("Error: --data-parallel-multi-port-external-lb does not support --grpc")
    if args.grpc_port is not None:
        raise ValueError("--grpc-port is incompatible with --data-parallel-multi-port-external-lb:"
                         " its frontends would share the same gRPC port")
    if bool(args.ssl_keyfile) != bool(args.ssl_certfile):
        raise ValueError("Error: --ssl-keyfile and --ssl-certfile must be provided together")
    if args.api_server_count not in (None, 1):
        raise ValueError("Error: --data-parallel-multi-port-external-lb currently requires "
                         "--api-server-count=1")
    if args.data_parallel_rank is not None:
        raise ValueError("Error: --data-parallel-multi-port-external-lb manages child "
                         "--data-parallel-rank values internally")
    if args.data_parallel_external_lb or args.data_parallel_hybrid_lb:
        raise ValueError("Error: --data-parallel-multi-port-external-lb cannot be combined with "
                         "--data-parallel-external-lb or --data-parallel-hybrid-lb")
    size, local = args.data_parallel_size or 1, args.data_parallel_size_local
    if size < 2:
        raise ValueError("Error: --data-parallel-multi-port-external-lb requires "
                         "--data-parallel-size > 1")
    if local is None or local < 2:
        raise ValueError("Error: --data-parallel-multi-port-external-lb requires "
                         "--data-parallel-size-local >= 2")
    if local > size:
        raise ValueError("Error: --data-parallel-size-local cannot exceed --data-parallel-size")
    if size % local:
        raise ValueError("Error: --data-parallel-size must be divisible by "
                         "--data-parallel-size-local")
    if start_rank(args) + local > size:
        raise ValueError("Error: multi-port supervised ranks would exceed --data-parallel-size")
    first, last = args.port, args.port + local - 1
    if first <= args.data_parallel_supervisor_port <= last:
        raise ValueError(f"Error: --data-parallel-supervisor-port "
                         f"{args.data_parallel_supervisor_port} overlaps with child rank ports "
                         f"{first}-{last}")


def rank_args(args: argparse.Namespace) -> list[argparse.Namespace]:
    """Each local rank's `vllm serve` arguments, as vLLM's `_build_vllm_dp_server_args` makes
    them (an external-LB rank on its own port), after `validate`."""
    validate(args)
    out = []
    for i in range(args.data_parallel_size_local):
        child = copy.copy(args)
        child.port = args.port + i
        child.grpc_port = 0  # a free port: one default port cannot serve two ranks
        child.data_parallel_rank = start_rank(args) + i
        child.data_parallel_start_rank = None
        child.data_parallel_size_local = 1
        child.data_parallel_external_lb = True
        child.data_parallel_hybrid_lb = False
        child.data_parallel_multi_port_external_lb = False
        child.api_server_count = 1
        out.append(child)
    return out


def _run_rank(serve: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> None:
    """A rank's process: its pod, stopped (SIGTERM: it drains) if the supervisor dies."""
    os.setpgrp()  # the supervisor forwards Ctrl-C: a terminal's SIGINT reaches it alone
    parent = multiprocessing.parent_process()
    if parent is not None:
        def orphaned() -> None:
            multiprocessing.connection.wait([parent.sentinel])
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=orphaned, daemon=True, name="supervisor-watch").start()
    sys.exit(serve(args))


def _say(text: str) -> None:
    print(PREFIX + text, file=sys.stderr, flush=True)


class Supervisor:
    """The ranks' processes, their probes and the aggregated health endpoint (module
    docstring). `serve` runs one rank's pod from its arguments (cmd_vllm.cmd_vllm_serve)."""

    def __init__(self, args: argparse.Namespace, ranks: list[argparse.Namespace],
                 serve: Callable[[argparse.Namespace], int]) -> None:
        self.args, self.ranks, self.serve = args, ranks, serve
        self.host = args.host or os.environ.get("DOPPELCHIP_HOST", "127.0.0.1")
        self.interval = args.dp_supervisor_probe_interval_s
        self.ready = False
        self.failed = False
        self.processes: list[BaseProcess] = []
        self.stopping = asyncio.Event()
        self.signal = signal.SIGTERM

    def run(self) -> int:
        import uvloop

        return uvloop.run(self._run())

    async def _run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        server = None
        try:
            self._start_ranks()
            monitor = asyncio.create_task(self._monitor())
            _say("Waiting for vLLM DP Servers to become ready.")
            while not self.ready and not self.stopping.is_set() and not monitor.done():
                await asyncio.wait([monitor], timeout=0.05)
            if self.ready and not monitor.done():
                server = await self._start_server()
            await monitor
        finally:
            self.ready = False
            await asyncio.to_thread(self._stop_ranks)
            if server is not None:
                await server.stop()
        return 1 if self.failed else 0

    def _on_signal(self, sig: int) -> None:
        if self.stopping.is_set():
            return
        self.signal = signal.Signals(sig)
        _say(f"DPSupervisor received {self.signal.name}, shutting down.")
        self.ready = False
        self.stopping.set()

    def _start_ranks(self) -> None:
        _say("Launching vLLM DP Servers")
        context = multiprocessing.get_context("spawn")
        for child in self.ranks:
            p = context.Process(target=_run_rank, args=(self.serve, child),
                                name=f"APIServer_DPRank_{child.data_parallel_rank}")
            p.start()
            self.processes.append(p)

    async def _monitor(self) -> None:
        """Until a stop: a rank's process that exited, or the probes ending (a rank unhealthy
        once ready), fails the pod."""
        probes = asyncio.create_task(self._probe_all())
        try:
            while not self.stopping.is_set():
                if gone := sum(not p.is_alive() for p in self.processes):
                    _say(f"DPSupervisor found {gone} exited DP Servers.")
                    self.failed = True
                    return
                if probes.done():
                    self.failed = True
                    return
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), self.interval)
        finally:
            probes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probes

    async def _probe_all(self) -> None:
        while not self.stopping.is_set():
            tries = self.args.dp_supervisor_probe_failure_threshold if self.ready else 1
            healthy = await asyncio.gather(*(self._probe(child.port, tries)
                                             for child in self.ranks))
            if all(healthy):
                if not self.stopping.is_set():
                    self.ready = True
            elif self.ready:
                _say(f"DPSupervisor probe found {healthy.count(False)} unhealthy DP Servers.")
                self.ready = False
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.interval)

    async def _probe(self, port: int, tries: int) -> bool:
        """A rank's `/health` answers 200; a connection error is retried `tries` times, one
        probe interval apart; any HTTP answer is final (vLLM answers 503 for a dead engine)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        tls = bool(self.args.ssl_keyfile and self.args.ssl_certfile)
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        url = f"{'https' if tls else 'http'}://{netloc}/health"
        context = ssl._create_unverified_context() if tls else None  # loopback: no SAN check
        timeout = self.args.dp_supervisor_probe_timeout_s

        def get() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=timeout, context=context) as r:
                    return r.status == 200
            except urllib.error.HTTPError:
                return False

        for attempt in range(tries):
            try:
                return await asyncio.to_thread(get)
            except (OSError, TimeoutError):
                if attempt < tries - 1:
                    await asyncio.sleep(self.interval)
        return False

    async def _start_server(self) -> HttpServer:
        """The aggregated health endpoint, started once every rank is ready (so an external
        probe never sees it while the ranks start) on the project's listener (TLS as the
        ranks'): 200 while ready, else 503."""
        from fastapi import FastAPI, Response

        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

        async def health() -> Response:
            return Response(status_code=200 if self.ready and not self.stopping.is_set()
                            else 503)

        for path in ("/health", "/ready", "/readyz"):
            app.add_api_route(path, health, methods=["GET"], include_in_schema=False)
        a, port = self.args, self.args.data_parallel_supervisor_port
        server = HttpServer(app, self.host, port, reuse_port=False, options=ListenerOptions(
            ssl_keyfile=a.ssl_keyfile or "", ssl_certfile=a.ssl_certfile or "",
            ssl_ca_certs=a.ssl_ca_certs or ""))
        await server.start()
        _say(f"Started DPSupervisor on {self.host}:{port}")
        return server

    def _stop_ranks(self) -> None:
        """Forward the signal to the ranks still running, wait, kill what is left."""
        sig = self.signal
        _say(f"DPSupervisor forwarding {sig.name} to DP Servers.")
        for p in self.processes:
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(p.pid, sig)
        deadline = time.monotonic() + EXIT_GRACE_S + (self.args.shutdown_timeout or 0)
        for p in self.processes:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.processes:
            if p.is_alive() and p.pid is not None:
                _say(f"DP server {p.name} did not exit within the grace period; force killing.")
                with contextlib.suppress(OSError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.join()
