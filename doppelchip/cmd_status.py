"""`doppelchip status`: a running server's deployments, their state, capacity and load.

Everything comes from the wire API (`ListDeployments` and the standard health service); the
one thing the proto has no field for, a deployment that is asleep (sleep mode, issue 13), is
read from the server's `/metrics` (`vllm:engine_sleep_state{sleep_state="awake"} == 0`), on
loopback only. When `/metrics` cannot be read the states are the wire API's alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from doppelchip import exit_codes
from doppelchip.client_flags import add_client_security_args, client_security


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "status", help="list a running server's deployments, their state, capacity and load",
        description="Ask a running doppelchip server (ListDeployments and gRPC health) for "
        "each deployment's state (READY, COMPILING, FAILED with its reason, DRAINING, or "
        "SLEEPING from /metrics), capacity (KV blocks and tokens, max_num_seqs, "
        "max_model_len) and load (running and waiting requests, KV cache usage).",
    )
    p.add_argument("--target", default="127.0.0.1:50051",
                   help="server address host:port (default 127.0.0.1:50051)")
    p.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                   help="deadline of each call (default 5)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_client_security_args(p)
    p.set_defaults(func=cmd_status)


def _state_name(value: int) -> str:
    from doppelchip.v1 import inference_pb2 as pb

    return pb.DeploymentState.Name(value).removeprefix("DEPLOYMENT_STATE_")


def sleeping_deployments(host: str, metrics_port: int, names: list[str]) -> set[str] | None:
    """The deployments with a sleeping engine rank, from the server's /metrics; None when
    there is no endpoint or it cannot be read. A pod's series carry no `deployment` label:
    then the one deployment it serves is meant."""
    from prometheus_client.parser import text_string_to_metric_families

    if not metrics_port or host not in ("127.0.0.1", "localhost", "[::1]"):
        return None
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{host}:{metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    asleep: set[str] = set()
    for family in text_string_to_metric_families(text):
        if family.name != "vllm:engine_sleep_state":
            continue
        for s in family.samples:
            if s.labels.get("sleep_state") == "awake" and s.value == 0:
                name = s.labels.get("deployment") or (names[0] if len(names) == 1 else "")
                asleep.add(name)
    return asleep


def deployment_row(d: Any, asleep: set[str] | None) -> dict[str, Any]:
    """One deployment as the JSON output gives it (the table prints the same fields)."""
    cap, load = d.capacity, d.load
    state = _state_name(d.state)
    if asleep and d.name in asleep and state == "READY":
        state = "SLEEPING"
    used = cap.kv_blocks_total - cap.kv_blocks_free
    return {
        "name": d.name, "state": state, "state_message": d.state_message,
        "is_default": d.is_default, "model": d.model, "quant": d.quant, "engine": d.engine,
        "chip": d.device.chip, "chips": d.device.count,
        "tensor_parallel": d.device.tensor_parallel,
        "pipeline_parallel": d.device.pipeline_parallel,
        "capacity": {"kv_blocks_total": cap.kv_blocks_total,
                     "kv_blocks_free": cap.kv_blocks_free, "block_size": cap.block_size,
                     "kv_tokens": cap.kv_blocks_total * cap.block_size,
                     "max_model_len": cap.max_model_len, "max_num_seqs": cap.max_num_seqs,
                     "max_concurrency": cap.max_concurrency, "max_waiting": cap.max_waiting},
        "load": {"running": load.num_running, "waiting": load.num_waiting,
                 "kv_usage": round(used / cap.kv_blocks_total, 4) if cap.kv_blocks_total else 0},
        "adapters": [a.name for a in d.adapters],
    }


def fetch_status(target: str, timeout: float, security: dict[str, Any]) -> dict[str, Any]:
    """The server's status as one JSON-able object. Raises grpc.RpcError."""
    from grpc_health.v1 import health_pb2

    from clients.client import Client

    with Client(target, **security) as client:
        listing = client.list_deployments(timeout=timeout)
        serving = health_pb2.HealthCheckResponse.ServingStatus.Name(client.health(
            timeout=timeout))
    names = [d.name for d in listing.deployments]
    asleep = sleeping_deployments(target.rpartition(":")[0], listing.metrics_port, names)
    return {
        "target": target, "health": serving, "time_scale": listing.time_scale,
        "http_port": listing.metrics_port, "default_deployment": listing.default_deployment,
        "sleep_state_known": asleep is not None,
        "deployments": [deployment_row(d, asleep) for d in listing.deployments],
    }


def format_status(status: dict[str, Any]) -> str:
    """The human table: one line per deployment, then why each one that is not serving
    (FAILED, COMPILING, DRAINING) is so."""
    from doppelchip.cmd_devices import table

    http = f", HTTP and /metrics on :{status['http_port']}" if status["http_port"] else ""
    lines = [f"server {status['target']}: {status['health']}, time scale "
             f"{status['time_scale']:g} wall s per emulated s{http}", ""]
    rows = [["deployment", "state", "model", "engine", "chip", "KV blocks free/total",
             "KV tokens", "max seqs", "max len", "running", "waiting", "KV used"]]
    for d in status["deployments"]:
        cap, load = d["capacity"], d["load"]
        rows.append([d["name"] + (" *" if d["is_default"] else ""), d["state"],
                     f"{d['model']} {d['quant']}", d["engine"], f"{d['chips']}x {d['chip']}",
                     f"{cap['kv_blocks_free']}/{cap['kv_blocks_total']}", str(cap["kv_tokens"]),
                     str(cap["max_num_seqs"]), str(cap["max_model_len"]), str(load["running"]),
                     str(load["waiting"]), f"{load['kv_usage']:.1%}"])
    lines.append(table(rows))
    lines.append("* the default deployment (requests that name none)")
    lines += [f"{d['name']}: {d['state']}: {d['state_message']}" for d in status["deployments"]
              if d["state_message"] and d["state"] not in ("READY", "SLEEPING")]
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    import grpc

    try:
        security = client_security(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_codes.USAGE
    try:
        status = fetch_status(args.target, args.timeout, security)
    except grpc.RpcError as e:
        print(f"error: {e.code().name}: {e.details()}", file=sys.stderr)
        return exit_codes.FAILED
    print(json.dumps(status) if args.json else format_status(status))
    return exit_codes.OK
