"""`doppelchip gateway`: replicas + smg as processes on loopback, a request through, a clean
stop on SIGTERM (exit 0, no process left)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gateway_harness import SMG, free_port, http

from doppelchip.cli import build_parser
from doppelchip.cmd_gateway import replica_cmd, smg_cmd

ROOT = Path(__file__).resolve().parents[2]


def free_pair() -> int:
    """A port p with p + 1 free too (the replicas count up from --port)."""
    for _ in range(50):
        p = free_port()
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", p + 1)) != 0:
                return p
    raise RuntimeError("no two consecutive free ports")


def test_commands_bind_loopback_and_front_one_deployment():
    args = build_parser().parse_args(["gateway", "--replicas", "3", "--port", "6000",
                                      "--deployment", "sglang-h100"])
    serve = replica_cmd(args, 2)
    assert serve[serve.index("--port") + 1] == "6002"
    assert serve[serve.index("--deployment") + 1] == "sglang-h100"  # a pod of it alone
    assert serve[serve.index("--host") + 1] == "127.0.0.1"
    launch = smg_cmd(args, "smg")
    assert launch[launch.index("--host") + 1] == "127.0.0.1"
    assert launch[launch.index("--prometheus-host") + 1] == "127.0.0.1"
    assert [u for u in launch if u.startswith("grpc://")] == [
        f"grpc://127.0.0.1:{p}" for p in (6000, 6001, 6002)]


def test_sglang_replicas_are_http_workers():
    args = build_parser().parse_args(["gateway", "--replicas", "2", "--port", "6000",
                                      "--http-port", "7000", "--deployment", "sglang-h100",
                                      "--http-api", "sglang"])
    serve = replica_cmd(args, 1)
    assert serve[serve.index("--http-api") + 1] == "sglang"
    launch = smg_cmd(args, "smg")
    urls = launch[launch.index("--worker-urls") + 1:launch.index("--prometheus-host")]
    assert urls == ["http://127.0.0.1:7000", "http://127.0.0.1:7001"]
    default = build_parser().parse_args(["gateway"])
    assert "--http-api" not in replica_cmd(default, 0)


@pytest.mark.parametrize("argv, scheme", [
    (["--http-api", "sglang", "--workers", "grpc"], "grpc://127.0.0.1:600"),  # its scheduler
    (["--workers", "http"], "http://127.0.0.1:700"),  # vLLM pods as smg's HTTP workers
    ([], "grpc://127.0.0.1:600"), (["--http-api", "sglang"], "http://127.0.0.1:700"),
])
def test_workers_choose_the_protocol_smg_speaks(argv, scheme):
    args = build_parser().parse_args(["gateway", "--port", "6000", "--http-port", "7000",
                                      *argv])
    launch = smg_cmd(args, "smg")
    urls = launch[launch.index("--worker-urls") + 1:launch.index("--prometheus-host")]
    assert urls == [f"{scheme}0", f"{scheme}1"]


def test_trtllm_replicas_serve_trtllms_service_and_smg_is_told_the_model(tmp_path):
    args = build_parser().parse_args(["gateway", "--deployment", "trtllm-h100",
                                      "--grpc-api", "trtllm"])
    serve = replica_cmd(args, 0)
    assert serve[serve.index("--grpc-api") + 1] == "trtllm"
    launch = smg_cmd(args, "smg")
    assert launch[launch.index("--model-path") + 1] == "llama-3.1-8b"  # trtllm-h100's model
    assert "--model-path" not in smg_cmd(build_parser().parse_args(["gateway"]), "smg")
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[deployments]]\nname = "t"\nmodel = "llama-3.1-8b"\nquant = "bf16"\n'
                     'chip = "h100-sxm"\nengine = "tensorrt-llm"\n'
                     'served_model_name = ["my-llama"]\n')
    named = build_parser().parse_args(["gateway", "--config", str(fleet), "--deployment", "t",
                                       "--grpc-api", "trtllm"])
    launch = smg_cmd(named, "smg")
    assert launch[launch.index("--model-path") + 1] == "my-llama"  # the served name
    missing = build_parser().parse_args(["gateway", "--deployment", "nope", "--grpc-api",
                                         "trtllm"])
    with pytest.raises(ValueError, match="'nope' is not in the fleet"):
        smg_cmd(missing, "smg")


def test_mlx_replicas_serve_mlx_engine_and_smg_needs_no_model_path():
    """`--grpc-api mlx`: each replica serves MlxEngine; MLX's model info names the model path,
    so smg is not told it (docs/MLX.md)."""
    args = build_parser().parse_args(["gateway", "--deployment", "mlx-m4max",
                                      "--grpc-api", "mlx"])
    serve = replica_cmd(args, 0)
    assert serve[serve.index("--grpc-api") + 1] == "mlx"
    assert serve[serve.index("--deployment") + 1] == "mlx-m4max"
    assert "--model-path" not in smg_cmd(args, "smg")


def start_gateway(tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    """The gateway, started and ready: (process, gateway port, log). Ports are picked free
    and may be taken by someone else before the gateway binds them (a race with other
    programs' connections, not a fault of the gateway): then it exits at once saying so, and
    is started again on other ports (three tries)."""
    for attempt in range(3):
        gw_port = free_port()
        cmd = [sys.executable, "-m", "doppelchip.cli", "gateway", "--replicas", "2",
               "--port", str(free_pair()), "--http-port", str(free_pair()),
               "--gateway-port", str(gw_port), "--prometheus-port", str(free_port()),
               "--time-scale", "0.05", "--ready-timeout", "30"]
        path = tmp_path / f"gateway-{attempt}.log"
        with path.open("wb") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 40
        while b"OpenAI API on" not in path.read_bytes():
            if proc.poll() is not None:
                break
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
                raise AssertionError("gateway not ready:\n" + path.read_text())
            time.sleep(0.1)
        else:
            return proc, gw_port, path
        text = path.read_text()
        assert "is already in use" in text, text  # any other exit is a failure
    raise AssertionError("three tries, each lost a port race:\n" + text)


@pytest.mark.skipif(SMG is None, reason="smg is not installed (make install-dev)")
def test_gateway_command_serves_and_stops_cleanly(tmp_path):
    proc, gw_port, _ = start_gateway(tmp_path)
    try:
        status, body = http("POST", f"http://127.0.0.1:{gw_port}/v1/completions", {
            "model": "llama-3.1-8b", "prompt": "hello", "max_tokens": 4, "ignore_eos": True})
        assert status == 200 and body["usage"]["completion_tokens"] == 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


# ---- lifecycle (issue 15): a replica's own error; smg stops before the replicas drain -------


@pytest.mark.skipif(SMG is None, reason="smg is not installed (make install-dev)")
def held_port(avoid: set[int]) -> socket.socket:
    """A socket listening on p (replica 0's gRPC port, held by someone else) with p + 1
    (replica 1's) free and neither in `avoid` (the other ports the command is given): only
    replica 0 can fail, so the report must be its own."""
    for _ in range(50):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen()
        p = s.getsockname()[1]
        with socket.socket() as probe:
            if not {p, p + 1} & avoid and probe.connect_ex(("127.0.0.1", p + 1)) != 0:
                return s
        s.close()
    raise RuntimeError("no held port with a free successor")


def test_a_replica_that_cannot_start_is_reported_with_its_own_error():
    http, gateway, prometheus = free_pair(), free_port(), free_port()
    with held_port({http, http + 1, gateway, prometheus}) as taken:
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "doppelchip.cli", "gateway", "--replicas", "2",
               "--port", str(port), "--http-port", str(http),
               "--gateway-port", str(gateway), "--prometheus-port", str(prometheus),
               "--ready-timeout", "60"]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=90,
                             stdin=subprocess.DEVNULL)
    assert out.returncode == 1, out.stderr
    assert (f"error: a replica did not start: replica 0 (gRPC port {port}) exited with "
            "status 1; its last stderr lines:") in out.stderr, out.stderr
    # the tail quotes the replica's own reason, indented under the report
    assert re.search(rf"(?m)^  \| error: gRPC port 127\.0\.0\.1:{port} is already in use$",
                     out.stderr), out.stderr
    assert "smg did not become ready" not in out.stderr


CHILD = """
import signal, sys, time
log, role, linger = sys.argv[1], sys.argv[2], float(sys.argv[3])
def on_term(*_):
    with open(log, "a") as f:
        f.write(f"{role} got SIGTERM\\n")
    time.sleep(linger)  # a gateway's grace period: the next group must wait for it
    with open(log, "a") as f:
        f.write(f"{role} exited\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", file=sys.stderr, flush=True)
while True:
    signal.pause()
"""


def test_stop_in_order_stops_smg_first_then_the_replicas(tmp_path: Path):
    from doppelchip.procs import Child, stop_in_order

    log = tmp_path / "order.log"
    script = tmp_path / "child.py"
    script.write_text(CHILD)

    def child(role: str, linger: float) -> Child:
        return Child(role, [sys.executable, str(script), str(log), role, str(linger)],
                     ready_text="ready")

    smg, replicas = child("smg", 0.3), [child("replica-0", 0), child("replica-1", 0)]
    for c in (smg, *replicas):
        assert c.ready.wait(30), c.name
    stop_in_order([[smg], replicas])
    lines = log.read_text().splitlines()
    assert lines[:2] == ["smg got SIGTERM", "smg exited"], lines
    assert sorted(lines[2:]) == sorted(f"{r} {e}" for r in ("replica-0", "replica-1")
                                       for e in ("got SIGTERM", "exited"))
    assert all(c.poll() == 0 for c in (smg, *replicas))


def test_child_failure_names_the_exit_status_and_the_stderr_tail():
    from doppelchip.procs import Child

    code = "import sys\nfor i in range(30): print(f'line {i}', file=sys.stderr)\nsys.exit(3)"
    c = Child("replica 7", [sys.executable, "-c", code], keep=3)
    report = c.failure()
    assert report == ("replica 7 exited with status 3; its last stderr lines:"
                      "\n  | line 27\n  | line 28\n  | line 29")
