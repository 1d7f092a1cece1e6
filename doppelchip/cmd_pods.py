"""`doppelchip pods`: one vLLM-style pod per deployment of a fleet, on successive ports, for
testing routers on a laptop.

Pod i is `doppelchip serve --deployment NAME_i --port PORT+i --http-port HTTP+i`
(every flag of `serve` that a pod takes is passed through with `--pod-arg`); all bind 127.0.0.1.
Ctrl-C (or SIGTERM) drains every pod; a pod that exits early stops the rest.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from doppelchip.procs import listening, stop, wait_until

HOST = "127.0.0.1"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "pods", help="serve each deployment of a fleet as its own pod, on successive ports",
        description="Start one `doppelchip serve --deployment NAME` pod per deployment of the "
        "fleet (or of --deployments), pod i on gRPC port --port+i and HTTP (OpenAI API and "
        "/metrics) port --http-port+i, all on 127.0.0.1; print where each listens; Ctrl-C stops "
        "them.")
    p.add_argument("--config", metavar="FILE", help="fleet TOML file (default: built-in fleet)")
    p.add_argument("--deployments", metavar="A,B,...",
                   help="the deployments to start (default: every deployment of the fleet)")
    p.add_argument("--port", type=int, default=50051,
                   help="gRPC port of the first pod; the next ones count up (default 50051)")
    p.add_argument("--http-port", "--metrics-port", dest="http_port", type=int, default=8000,
                   help="HTTP (OpenAI API and /metrics) port of the first pod; the next ones "
                   "count up (default 8000)")
    p.add_argument("--pod-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for every pod's `serve` (repeatable), e.g. "
                   "--pod-arg=--time-scale=0.1")
    p.add_argument("--ready-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="give up if the pods are not listening in time (default 60)")
    p.set_defaults(func=cmd_pods)


def pod_cmd(args: argparse.Namespace, name: str, i: int) -> list[str]:
    cmd = [sys.executable, "-m", "doppelchip.cli", "serve", "--host", HOST, "--deployment", name,
           "--port", str(args.port + i), "--http-port", str(args.http_port + i)]
    if args.config:
        cmd += ["--config", args.config]
    return cmd + args.pod_arg


def cmd_pods(args: argparse.Namespace) -> int:
    from server.config import ConfigError, load_fleet

    try:
        fleet = load_fleet(args.config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    names = [d.name for d in fleet.deployments]
    chosen = args.deployments.split(",") if args.deployments else names
    unknown = [n for n in chosen if n not in names]
    if unknown:
        print(f"error: unknown deployment(s) {', '.join(unknown)}; the fleet has "
              f"{', '.join(names)}", file=sys.stderr)
        return 2
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    procs: list[subprocess.Popen] = []
    try:
        for i, name in enumerate(chosen):
            procs.append(subprocess.Popen(pod_cmd(args, name, i), stdin=subprocess.DEVNULL))
        ports = [args.port + i for i in range(len(chosen))]
        deadline = time.monotonic() + args.ready_timeout
        if not wait_until(lambda: all(listening(HOST, p) for p in ports), deadline, procs):
            failed = [n for n, p in zip(chosen, procs, strict=True) if p.poll() is not None]
            print(f"error: pod(s) did not start: {', '.join(failed) or 'timed out'}",
                  file=sys.stderr)
            return 1
        for i, name in enumerate(chosen):
            print(f"{name}\tgrpc {HOST}:{args.port + i}\thttp {HOST}:{args.http_port + i}",
                  flush=True)
        print(f"doppelchip pods: {len(chosen)} pods up; Ctrl-C stops", file=sys.stderr,
              flush=True)
        while not stopping.is_set():
            if any(p.poll() is not None for p in procs):
                print("error: a pod exited", file=sys.stderr)
                return 1
            stopping.wait(0.5)
        return 0
    finally:
        stop(procs)
