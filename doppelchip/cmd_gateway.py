"""`doppelchip gateway`: doppelchip replicas behind the smg gateway, all on loopback.

Starts `--replicas` `doppelchip serve --deployment NAME` pods (replica i on gRPC port
`--port + i`, HTTP and metrics on `--http-port + i`), then
`smg launch --host 127.0.0.1 --port GATEWAY_PORT --worker-urls grpc://127.0.0.1:P ...
--prometheus-host 127.0.0.1` (smg binds 0.0.0.0 unless told), waits until smg is ready, prints
the OpenAI base URL, and on SIGINT/SIGTERM stops smg and drains the replicas.
smg is a dev dependency (`pip install -e '.[dev]'`, pinned smg==1.13.0).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from doppelchip.procs import listening, stop, wait_until

HOST = "127.0.0.1"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "gateway", help="serve replicas of one deployment behind the smg gateway (OpenAI HTTP)",
        description="Start doppelchip replicas of one deployment and the smg gateway in front "
        "of them (vllm.grpc.engine over gRPC), all on 127.0.0.1; Ctrl-C stops everything.",
    )
    p.add_argument("--deployment", default="vllm-h100", metavar="NAME",
                   help="deployment every replica fronts (default vllm-h100)")
    p.add_argument("--replicas", type=int, default=2, help="replica count (default 2)")
    p.add_argument("--config", metavar="FILE", help="fleet TOML file (default: built-in fleet)")
    p.add_argument("--port", type=int, default=50051,
                   help="gRPC port of the first replica; the next ones count up (default 50051)")
    p.add_argument("--http-port", "--metrics-port", dest="http_port", type=int, default=8000,
                   help="HTTP (OpenAI API and /metrics) port of the first replica; the next ones "
                   "count up (default 8000)")
    p.add_argument("--gateway-port", type=int, default=30000,
                   help="smg's OpenAI HTTP port (default 30000)")
    p.add_argument("--prometheus-port", type=int, default=29000,
                   help="smg's own /metrics port (default 29000)")
    p.add_argument("--policy", default="round_robin",
                   help="smg routing policy (default round_robin; smg's own default is "
                   "cache_aware)")
    p.add_argument("--time-scale", type=float, help="the replicas' time scale")
    p.add_argument("--ready-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="give up if the gateway is not ready in time (default 60)")
    p.add_argument("--smg-arg", action="append", default=[], metavar="ARG",
                   help="extra argument passed to `smg launch` (repeatable)")
    p.set_defaults(func=cmd_gateway)


def find_smg() -> str | None:
    return shutil.which("smg", path=str(Path(sys.executable).parent)) or shutil.which("smg")


def replica_cmd(args: argparse.Namespace, i: int) -> list[str]:
    cmd = [sys.executable, "-m", "doppelchip.cli", "serve", "--host", HOST,
           "--port", str(args.port + i), "--http-port", str(args.http_port + i),
           "--deployment", args.deployment]
    if args.config:
        cmd += ["--config", args.config]
    if args.time_scale is not None:
        cmd += ["--time-scale", str(args.time_scale)]
    return cmd


def smg_cmd(args: argparse.Namespace, smg: str) -> list[str]:
    urls = [f"grpc://{HOST}:{args.port + i}" for i in range(args.replicas)]
    return [smg, "launch", "--host", HOST, "--port", str(args.gateway_port),
            "--worker-urls", *urls, "--prometheus-host", HOST,
            "--prometheus-port", str(args.prometheus_port), "--policy", args.policy,
            "--shutdown-grace-period-secs", "5", "--log-level", "warn", *args.smg_arg]


def _ready(port: int, replicas: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/readiness", timeout=2) as r:
            body = json.loads(r.read())
    except (OSError, ValueError):
        return False
    return body.get("healthy_workers", 0) >= replicas


def cmd_gateway(args: argparse.Namespace) -> int:
    smg = find_smg()
    if smg is None:
        print("error: smg is not installed; `make install-dev` (smg==1.13.0 is a dev "
              "dependency)", file=sys.stderr)
        return 2
    if args.replicas < 1:
        print("error: --replicas must be >= 1", file=sys.stderr)
        return 2
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    procs: list[subprocess.Popen] = []
    try:
        for i in range(args.replicas):
            procs.append(subprocess.Popen(replica_cmd(args, i), stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + args.ready_timeout
        ports = [args.port + i for i in range(args.replicas)]
        if not wait_until(lambda: all(listening(HOST, p) for p in ports), deadline, procs):
            print("error: the replicas did not start", file=sys.stderr)
            return 1
        procs.append(subprocess.Popen(smg_cmd(args, smg), stdin=subprocess.DEVNULL))
        if not wait_until(lambda: _ready(args.gateway_port, args.replicas), deadline, procs):
            print("error: smg did not become ready", file=sys.stderr)
            return 1
        print(f"doppelchip gateway: OpenAI API on http://{HOST}:{args.gateway_port}/v1 "
              f"({args.replicas} x {args.deployment} on gRPC ports "
              f"{', '.join(map(str, ports))}); Ctrl-C stops", file=sys.stderr, flush=True)
        while not stopping.is_set():
            if any(p.poll() is not None for p in procs):
                print("error: a replica or smg exited", file=sys.stderr)
                return 1
            stopping.wait(0.5)
        return 0
    finally:
        stop(procs)
