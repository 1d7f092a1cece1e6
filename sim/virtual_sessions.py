"""The virtual-time event loop's sessions: which turn arrives when (issue 16).

Why it exists apart from `sim.virtual`: where turns come from is one concern — open loop (each
session starts at its `start_s`; a lazy `clients.workloads.Workload` is drawn one session
ahead, so memory stays flat), closed loop (`concurrency` sessions at once, the next starting
when one ends), and follow-up turns due `think_time_s` after the one before ended — and the
loop stays readable. `SessionSource` is a mixin of `virtual._Runner`: it keeps the `arrivals`
heap (which `virtual_macro` reads to bound its windows), the sessions started and not yet
over, and reads the runner's clock `t`.

Arrivals are (time, 0, session, session, 0, ()) for a session's first turn in open loop, before
(time, 1, seq, session, turn, history) any other turn due at that instant — as when every
session was queued first.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from clients.conversation import Conversation

Arrival = tuple[float, int, int, int, int, tuple[int, ...]]


class SessionSource:
    """The session half of the event loop (see the module docstring)."""

    t: float

    def _start_sessions(self, sessions: Iterable[Conversation], concurrency: int | None) -> None:
        self.arrivals: list[Arrival] = []
        self.seq = 0  # tie-break of the turns due at one instant: in the order they became due
        # the sessions started and not yet over (a lazy workload's are drawn as they start)
        self.sessions: dict[int, Conversation] = {}
        self.source: Iterator[tuple[int, Conversation]] = (
            (i, s) for i, s in enumerate(sessions) if s.turns)
        self.closed = concurrency is not None
        self.lazy = not isinstance(sessions, list)
        if self.closed:
            for _ in range(concurrency or 0):
                self._next_session()
        elif self.lazy:  # in order of start: the next one is always queued
            self._pull()
        else:
            while self._pull():
                pass

    def _pull(self) -> bool:
        """Open loop: queue the next session's first turn at its start."""
        nxt = next(self.source, None)
        if nxt is None:
            return False
        si, s = nxt
        self.sessions[si] = s
        heapq.heappush(self.arrivals, (s.start_s, 0, si, si, 0, ()))
        return True

    def _due(self, at: float, si: int, ti: int, history: tuple[int, ...]) -> None:
        """Turn `ti` of session `si` arrives at `at`, resending `history`."""
        heapq.heappush(self.arrivals, (at, 1, self.seq, si, ti, history))
        self.seq += 1

    def _next_session(self) -> None:
        """Closed loop: the next session in line starts now."""
        if self.closed and (nxt := next(self.source, None)) is not None:
            self.sessions[nxt[0]] = nxt[1]
            self._due(self.t, nxt[0], 0, ())

    def _session_over(self, si: int) -> None:
        """A session's last turn ended (or one was refused): forget it, start the next."""
        del self.sessions[si]
        self._next_session()

    def _arrived(self) -> Iterator[Arrival]:
        """The turns due by now, in order (a lazy open loop queues the next session's start as
        each first turn is taken)."""
        arrivals = self.arrivals
        while arrivals and arrivals[0][0] <= self.t:
            item = heapq.heappop(arrivals)
            if item[1] == 0 and self.lazy:
                self._pull()
            yield item
