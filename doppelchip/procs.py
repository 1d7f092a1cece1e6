"""Child servers of the front door's multi-process commands (`gateway`, `pods`): wait for
them, stop them."""

from __future__ import annotations

import signal
import socket
import subprocess
import time


def listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_until(cond, deadline: float, procs: list[subprocess.Popen]) -> bool:
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            return False
        if cond():
            return True
        time.sleep(0.1)
    return False


def stop(procs: list[subprocess.Popen], timeout: float = 15.0) -> None:
    """SIGTERM each (smg first: it is last in the list), then wait; kill what is left."""
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in reversed(procs):
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
