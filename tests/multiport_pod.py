"""A `vllm serve MOE -dp 2 -dpl 2 -dpm` pod (doppelchip/vllm_multiport.py) on loopback, for
tests: one rank per port (P, P + 1) behind the DP supervisor (S), its stderr collected."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading

import psutil

MOE = "Qwen/Qwen3-30B-A3B"


def _free_ports() -> tuple[int, int]:
    """(P, S): P and P + 1 free for the two ranks, S free for the supervisor."""
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b, socket.socket() as s:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            s.bind(("127.0.0.1", 0))
            return port, s.getsockname()[1]
    raise RuntimeError("no two consecutive free ports")


class MultiPortPod:
    """The pod; `wait_ready()` returns once the supervisor serves (both ranks healthy)."""

    def __init__(self, *extra: str) -> None:
        """`extra`: more `vllm serve` arguments."""
        self.port, self.supervisor = _free_ports()
        cmd = [sys.executable, "-m", "doppelchip.cli", "vllm", "serve", MOE, "-dp", "2",
               "-dpl", "2", "-dpm", "--port", str(self.port), "--data-parallel-supervisor-port",
               str(self.supervisor), "--dp-supervisor-probe-interval-s", "0.2",
               "--time-scale", "0.05", "--max-model-len", "4096", *extra]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.started = threading.Event()
        self.tree: list[psutil.Process] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if "Started DPSupervisor on" in line:
                self.started.set()
        self.started.set()

    def wait_ready(self) -> None:
        assert self.started.wait(120), "".join(self.lines[-20:])
        assert self.proc.poll() is None, "".join(self.lines[-20:])
        self.tree = psutil.Process(self.proc.pid).children(recursive=True)

    def ranks(self) -> list[psutil.Process]:
        return [p for p in psutil.Process(self.proc.pid).children()
                if "spawn_main" in " ".join(p.cmdline())]

    def stop(self) -> None:
        """SIGTERM (the supervisor stops its ranks), SIGKILL after 60 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for p in self.tree:  # what a failed test left running (the tests assert none is)
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
