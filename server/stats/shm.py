"""A float64 array (plus a short text) in a memory-mapped file: one writer, many readers.

Why: metrics and deployment status must be readable by any front end (for `/metrics`,
`ListDeployments`, health) without asking a busy engine over IPC, and must survive an engine
crash (counters stay monotone across a restart). A seqlock keeps every read consistent: the
writer makes the sequence odd while it writes and even after; a reader copies the array and
retries if the sequence was odd or changed meanwhile.
"""

from __future__ import annotations

import itertools
import mmap
import os
import time
from pathlib import Path

import numpy as np

TEXT_BYTES = 1024  # the state message (why a deployment failed, what it is compiling)


class StatsFile:
    def __init__(self, path: str | Path, size: int, create: bool = False) -> None:
        self.path, self.size = Path(path), size
        nbytes = 8 * (1 + size) + TEXT_BYTES
        if create:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size != nbytes:
                    os.ftruncate(fd, nbytes)
                self._mm = mmap.mmap(fd, nbytes)
            finally:
                os.close(fd)
        else:
            with open(self.path, "rb") as f:
                self._mm = mmap.mmap(f.fileno(), nbytes, access=mmap.ACCESS_READ)
        self._seq = np.frombuffer(self._mm, dtype=np.uint64, count=1)
        self.values = np.frombuffer(self._mm, dtype=np.float64, count=size, offset=8)
        self._text_at = 8 * (1 + size)

    # ---- writer ---------------------------------------------------------------------------
    def begin(self) -> None:
        """Odd while writing. A writer that was killed mid-update left the sequence odd: the
        next writer (the supervisor marking the deployment FAILED, the restarted engine)
        keeps it odd here and even at `end`, instead of inverting the parity for good."""
        s = int(self._seq[0])
        self._seq[0] = s + 1 if s % 2 == 0 else s + 2

    def end(self) -> None:
        s = int(self._seq[0])
        self._seq[0] = s + 1 if s % 2 == 1 else s + 2

    def set_text(self, text: str) -> None:
        """Set the text (inside a begin/end pair); longer text is cut at a character."""
        raw = text.encode()[: TEXT_BYTES - 1].decode(errors="ignore").encode()
        self._mm[self._text_at : self._text_at + TEXT_BYTES] = raw.ljust(TEXT_BYTES, b"\0")

    # ---- reader ---------------------------------------------------------------------------
    def snapshot(self, timeout_s: float = 2.0) -> tuple[np.ndarray, str]:
        """A consistent copy of the values and the text. An update takes microseconds, but
        the writer may be descheduled in the middle of one: after a few quick retries, yield
        the CPU between tries."""
        deadline = None
        for attempt in itertools.count():
            before = int(self._seq[0])
            if not before % 2:
                values = self.values.copy()
                raw = self._mm[self._text_at : self._text_at + TEXT_BYTES]
                if int(self._seq[0]) == before:
                    return values, raw.rstrip(b"\0").decode(errors="replace")
            if attempt >= 100:
                now = time.monotonic()
                deadline = deadline or now + timeout_s
                if now > deadline:
                    break
                time.sleep(0.0002)
        raise RuntimeError(f"{self.path}: the writer never finished an update")

    def close(self) -> None:
        del self._seq, self.values
        self._mm.close()
