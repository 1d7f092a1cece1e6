"""`doppelchip gateway`: doppelchip replicas behind the smg gateway, all on loopback.

Starts `--replicas` `doppelchip serve --deployment NAME` pods (replica i on gRPC port
`--port + i`, HTTP and metrics on `--http-port + i`), then
`smg launch --host 127.0.0.1 --port GATEWAY_PORT --worker-urls grpc://127.0.0.1:P ...
--prometheus-host 127.0.0.1` (smg binds 0.0.0.0 unless told; with `--http-api sglang` the
replicas are SGLang pods; with `--workers http`, the default for them, the worker URLs are
their `http://` ports), waits until
smg is ready, prints the OpenAI base URL, and on SIGINT/SIGTERM stops smg first (no new
request reaches a replica), waits for it to exit, then stops the replicas, which drain their
in-flight requests. A replica (or smg) that exits is reported with its own exit status and the
last lines of its stderr. smg is a dev dependency (`pip install -e '.[dev]'`, pinned smg==1.13.0).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from doppelchip import exit_codes
from doppelchip.procs import Child, first_exited, stop_in_order

HOST = "127.0.0.1"
READY_TEXT = "doppelchip: listening on"  # what `serve` prints once it serves


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "gateway", help="serve replicas of one deployment behind the smg gateway (OpenAI HTTP)",
        description="Start doppelchip replicas of one deployment and the smg gateway in front "
        "of them (their engine gRPC service, or their HTTP API), all on 127.0.0.1; Ctrl-C "
        "stops everything.",
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
    p.add_argument("--http-api", choices=["vllm", "sglang"], default="vllm",
                   help="the server the replicas imitate: vllm (default; vLLM's HTTP API, "
                   "vllm.grpc.engine on gRPC) or sglang (SGLang's HTTP API, "
                   "sglang.grpc.scheduler on gRPC: docs/SGLANG.md)")
    p.add_argument("--grpc-api", choices=["trtllm", "mlx"],
                   help="trtllm: the replicas serve TensorRT-LLM's trtllm.TrtllmService on "
                   "their gRPC port (`trtllm-serve --grpc`; use a tensorrt-llm deployment, e.g. "
                   "trtllm-h100) and smg fronts them as trtllm workers, told the model with "
                   "--model-path (docs/TRTLLM.md); mlx: MLX's mlx.grpc.engine.MlxEngine (use "
                   "an mlx deployment, e.g. mlx-m4max) and smg fronts them as mlx workers, "
                   "whose model info names the model (docs/MLX.md)")
    p.add_argument("--workers", choices=["grpc", "http"],
                   help="how smg talks to the replicas: grpc (their engine service; the "
                   "default for vllm) or http (their HTTP API; the default for sglang)")
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
    if args.http_api == "sglang":
        cmd += ["--http-api", "sglang"]
    if args.grpc_api:
        cmd += ["--grpc-api", args.grpc_api]
    return cmd


def workers(args: argparse.Namespace) -> str:
    """grpc or http: `--workers`, else http for SGLang pods (as smg fronts SGLang servers
    started without --smg-grpc-mode) and grpc for vLLM pods."""
    return args.workers or ("http" if args.http_api == "sglang" else "grpc")


def worker_urls(args: argparse.Namespace) -> list[str]:
    """What smg is given: each replica's gRPC port, or (HTTP workers) its HTTP port."""
    if workers(args) == "http":
        return [f"http://{HOST}:{args.http_port + i}" for i in range(args.replicas)]
    return [f"grpc://{HOST}:{args.port + i}" for i in range(args.replicas)]


def served_model(args: argparse.Namespace) -> str:
    """The name the replicas serve their deployment under (the fleet's `served_model_name`,
    else its catalogue model id)."""
    from server.config import load_fleet

    fleet = load_fleet(args.config)
    (dep,) = [d for d in fleet.deployments if d.name == args.deployment] or [None]
    if dep is None:
        raise ValueError(f"--deployment {args.deployment!r} is not in the fleet")
    return (dep.served_model_name or (dep.model,))[0]


def smg_cmd(args: argparse.Namespace, smg: str) -> list[str]:
    urls = worker_urls(args)
    # TensorRT-LLM's GetModelInfo names no path: smg is told the model, as for trtllm-serve
    model = (["--model-path", served_model(args)]
             if args.grpc_api == "trtllm" and workers(args) == "grpc" else [])
    return [smg, "launch", "--host", HOST, "--port", str(args.gateway_port),
            "--worker-urls", *urls, *model, "--prometheus-host", HOST,
            "--prometheus-port", str(args.prometheus_port), "--policy", args.policy,
            "--shutdown-grace-period-secs", "5", "--log-level", "warn", *args.smg_arg]


def _ready(port: int, replicas: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/readiness", timeout=2) as r:
            body = json.loads(r.read())
    except (OSError, ValueError):
        return False
    return body.get("healthy_workers", 0) >= replicas


def _wait(cond, deadline: float, children: list[Child]) -> Child | bool:
    """True once `cond()` holds; False at the deadline; the child that exited first if one
    did (it is reported with its own error)."""
    while time.monotonic() < deadline:
        if (dead := first_exited(children)) is not None:
            return dead
        if cond():
            return True
        time.sleep(0.1)
    return False


def cmd_gateway(args: argparse.Namespace) -> int:
    smg = find_smg()
    if smg is None:
        print("error: smg is not installed; `make install-dev` (smg==1.13.0 is a dev "
              "dependency)", file=sys.stderr)
        return exit_codes.USAGE
    if args.replicas < 1:
        print("error: --replicas must be >= 1", file=sys.stderr)
        return exit_codes.USAGE
    try:
        smg_argv = smg_cmd(args, smg)
    except ValueError as e:  # (the fleet file's ConfigError is one)
        print(f"error: {e}", file=sys.stderr)
        return exit_codes.USAGE
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    replicas: list[Child] = []
    gateway: list[Child] = []
    try:
        for i in range(args.replicas):
            replicas.append(Child(f"replica {i} (gRPC port {args.port + i})",
                                  replica_cmd(args, i), ready_text=READY_TEXT))
        deadline = time.monotonic() + args.ready_timeout
        up = _wait(lambda: all(r.ready.is_set() for r in replicas), deadline, replicas)
        if up is not True:
            why = up.failure() if up else "they did not start in time"
            print(f"error: a replica did not start: {why}", file=sys.stderr)
            return exit_codes.FAILED
        gateway.append(Child("smg", smg_argv))
        everyone = replicas + gateway
        up = _wait(lambda: _ready(args.gateway_port, args.replicas), deadline, everyone)
        if up is not True:
            why = up.failure() if up else "not ready in time"
            print(f"error: smg did not become ready: {why}", file=sys.stderr)
            return exit_codes.FAILED
        print(f"doppelchip gateway: OpenAI API on http://{HOST}:{args.gateway_port}/v1 "
              f"({args.replicas} x {args.deployment} at {', '.join(worker_urls(args))}); "
              "Ctrl-C stops", file=sys.stderr, flush=True)
        while not stopping.is_set():
            if (dead := first_exited(everyone)) is not None:
                print(f"error: {dead.failure()}", file=sys.stderr)
                return exit_codes.FAILED
            stopping.wait(0.5)
        return exit_codes.OK
    finally:
        stop_in_order([gateway, replicas])  # as docs/GATEWAY.md says: smg, then the replicas
