"""Child servers of the front door's multi-process commands (`gateway`, `pods`): wait for
them, report the one that died with its own error, stop them."""

from __future__ import annotations

import collections
import signal
import socket
import subprocess
import sys
import threading
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


class Child:
    """A child server whose stderr is forwarded to ours line by line, with its last lines kept
    so that a child that dies can be reported with its own error (exit status and stderr
    tail), and `ready` set once a line contains `ready_text` (a server's "listening on")."""

    def __init__(self, name: str, cmd: list[str], ready_text: str | None = None,
                 keep: int = 12) -> None:
        self.name, self.ready_text = name, ready_text
        self.tail: collections.deque[str] = collections.deque(maxlen=keep)
        self.ready = threading.Event()
        self.process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True, errors="replace")
        self._reader = threading.Thread(target=self._forward, daemon=True,
                                        name=f"stderr-{name}")
        self._reader.start()

    def _forward(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            self.tail.append(line.rstrip("\n"))
            if self.ready_text is not None and self.ready_text in line:
                self.ready.set()

    def poll(self) -> int | None:
        return self.process.poll()

    def failure(self) -> str:
        """How it ended: "NAME exited with status N" (or "was killed by SIGX") and the last
        lines of its stderr. Waits briefly for the reader to take in the last lines."""
        code = self.process.wait()
        self._reader.join(timeout=2)
        how = (f"was killed by {signal.Signals(-code).name}" if code < 0
               else f"exited with status {code}")
        lines = "".join(f"\n  | {line}" for line in self.tail) or "\n  | (no stderr output)"
        return f"{self.name} {how}; its last stderr lines:{lines}"


def first_exited(children: list[Child]) -> Child | None:
    return next((c for c in children if c.poll() is not None), None)


def stop_in_order(groups: list[list[Child]], timeout: float = 15.0) -> None:
    """Stop group after group: SIGTERM each child of a group, wait for all of them (kill
    what is left after `timeout`), then the next group. The gateway stops smg first, so no
    new request reaches a replica, then the replicas, which drain their in-flight requests."""
    for group in groups:
        stop([c.process for c in group], timeout)
