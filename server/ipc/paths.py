"""Where one server's sockets and shared files live: a private run directory.

Every endpoint is an `ipc://` path inside it (never a TCP port), so several servers run side
by side and nothing is reachable from the network. The supervisor creates the directory and
removes it on exit.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def create(cls) -> RunDir:
        return cls(tempfile.mkdtemp(prefix="doppelchip-"))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def _ipc(self, name: str) -> str:
        return f"ipc://{self.path / name}"

    def engine_input(self, deployment: int, rank: int) -> str:
        """Each engine core's PULL socket (front ends and the supervisor PUSH to it)."""
        return self._ipc(f"e{deployment}.{rank}.in")

    def frontend_input(self, frontend: int) -> str:
        """Each front end's PULL socket (engines and the supervisor PUSH to it)."""
        return self._ipc(f"f{frontend}.in")

    def supervisor_input(self) -> str:
        return self._ipc("supervisor.in")

    def engine_stats(self, deployment: int, rank: int) -> Path:
        return self.path / f"e{deployment}.{rank}.stats"

    def frontend_stats(self, frontend: int) -> Path:
        return self.path / f"f{frontend}.stats"

    def prometheus_dir(self) -> Path:
        """prometheus_client's multiprocess directory: every front end's HTTP series."""
        return self.path / "prometheus"
