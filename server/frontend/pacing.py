"""Coalescing under overload: when the front end's event loop is saturated, streams send
their tokens in fewer, larger messages.

Why this exists: a front end's cost is per message written (grpc's C core issues one
`sendmsg` per message; measured at ~1/3 of a saturated front end's CPU), and grpc.aio accepts
one new call per event-loop iteration. When every core is busy streaming one token per
message, iterations grow long, so new requests wait hundreds of milliseconds to seconds before
their handler even runs (an H100 at 256 streams on 2 cores: up to ~3 s), which no token time
can show. vLLM's own API server coalesces the same way when its consumer falls behind (the
output collector merges what was not read); this makes it happen before the loop saturates.

`LoopPacer` samples the loop's lateness with a periodic timer and keeps a `factor`: 1 while the
loop keeps up, doubled (up to `MAX_FACTOR`) while a tick runs late by more than `LATE_S`,
halved once it runs on time again. A stream wakes its consumer when `interval * factor`
tokens are pending; the first tokens and the finish still go at once, and token times always
carry the exact emulated times (only how many ride in one message changes).
"""

from __future__ import annotations

import asyncio

TICK_S = 0.005  # the sampling period
LATE_S = 0.004  # a tick this late: the loop is saturated
ON_TIME_S = 0.001  # a tick this close: it keeps up
MAX_FACTOR = 8


class LoopPacer:
    """The front end's coalescing factor (one per process; read by every `RequestStream`)."""

    __slots__ = ("_due", "_handle", "_loop", "factor")

    def __init__(self) -> None:
        self.factor = 1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._schedule()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def observe(self, lateness: float) -> int:
        """One tick ran `lateness` seconds after it was due: the new factor."""
        if lateness > LATE_S:
            self.factor = min(self.factor * 2, MAX_FACTOR)
        elif lateness < ON_TIME_S and self.factor > 1:
            self.factor //= 2
        return self.factor

    def _schedule(self) -> None:
        assert self._loop is not None
        self._due = self._loop.time() + TICK_S
        self._handle = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        self.observe(self._loop.time() - self._due)
        self._schedule()


UNPACED = LoopPacer()  # factor 1 forever (never started): streams outside a front end
