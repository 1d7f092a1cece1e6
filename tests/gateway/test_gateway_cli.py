"""`doppelchip gateway`: replicas + smg as processes on loopback, a request through, a clean
stop on SIGTERM (exit 0, no process left)."""

from __future__ import annotations

import os
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
