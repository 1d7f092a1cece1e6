"""The shared server: one `doppelchip serve` (the default fleet) for every block that talks to
a server without starting one (README's `generate "hello"`, docs/HTTP.md's curls, ...).

It listens on the documented ports' moved hundreds (`Moves`); those blocks run with them. Its
log goes to a file, not a pipe: nobody reads a pipe until the server stops, and at the default
log level a few hundred requests (a line each) fill one, after which every write blocks and
the server with it (every later block then hangs until its timeout).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from scripts.doccheck.commands import Moves, move
from scripts.doccheck.runner import allocate, release

GRPC, HTTP = 50051, 8000


class SharedServer:
    """Started lazily by the first block that needs it; stopped (SIGTERM) by `stop`."""

    def __init__(self, root: Path, ready_timeout: float = 120.0) -> None:
        self.root = root
        self.ready_timeout = ready_timeout
        self.moves: Moves = {}
        self.proc: subprocess.Popen | None = None
        self.log = ""
        self._log: Path | None = None
        self._lock = threading.Lock()

    def ensure(self) -> Moves:
        """The shared server's moves, once it answers /health (started on the first call)."""
        with self._lock:
            if self.proc is None:
                self._start()
            return self.moves

    def _start(self) -> None:
        self.moves = allocate({GRPC, HTTP})
        exe = self.root / ".venv" / "bin" / "doppelchip"
        self._log = Path(tempfile.mkdtemp(prefix="doccheck-shared-")) / "server.log"
        with self._log.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(exe), "serve", "--port", str(move(GRPC, self.moves)),
                 "--http-port", str(move(HTTP, self.moves))],
                cwd=self.root, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        url = f"http://127.0.0.1:{move(HTTP, self.moves)}/health"
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the shared server exited: {self._output()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)  # polling /health until the deadline
        self.stop()
        raise RuntimeError(f"the shared server was not ready in {self.ready_timeout:.0f} s")

    def _output(self) -> str:
        assert self._log is not None
        return self._log.read_text(errors="replace")

    def stop(self) -> int | None:
        """SIGTERM, then its exit status (the server drains and exits 0)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            rc = self.proc.wait()
        self.log = self._output()
        assert self._log is not None
        shutil.rmtree(self._log.parent, ignore_errors=True)
        self.proc = None
        release(self.moves)
        return rc
