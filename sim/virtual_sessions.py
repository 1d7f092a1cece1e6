"""The virtual-time event loop's sessions: which turn arrives when (issue 16).

Why it exists apart from `sim.virtual`: where turns come from is one concern — open loop (each
session starts at its `start_s`; a lazy `clients.workloads.Workload` is drawn one session
ahead, so memory stays flat), closed loop (`concurrency` sessions at once, the next starting
when one ends), and follow-up turns due `think_time_s` after the one before ended — and the
loop stays readable. `SessionSource` is a mixin of `virtual._Runner`: it keeps the `arrivals`
heap (which `virtual_macro` reads to bound its windows), the sessions started and not yet
over, and the turns the router holds (`held`: no replica ready, a pool at zero) until they are
routed or time out; it reads the runner's clock `t`, `control` and `out`.

Arrivals are (time, 0, session, session, 0, ()) for a session's first turn in open loop, before
(time, 1, seq, session, turn, history) any other turn due at that instant — as when every
session was queued first.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from clients.conversation import Conversation
from sim.virtual_types import failed, turn_id

if TYPE_CHECKING:
    from sim.virtual_types import Control, VirtualRun

Arrival = tuple[float, int, int, int, int, tuple[int, ...]]


class SessionSource:
    """The session half of the event loop (see the module docstring)."""

    t: float
    control: Control | None
    out: VirtualRun
    held: list[tuple[float, int, int, tuple[int, ...]]]  # (arrival, session, turn, history)

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
            for _ in range(concurrency or 0):  # (no more than there are sessions)
                if not self._next_session():
                    break
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

    def _next_session(self) -> bool:
        """Closed loop: the next session in line starts now (False: there is none)."""
        if self.closed and (nxt := next(self.source, None)) is not None:
            self.sessions[nxt[0]] = nxt[1]
            self._due(self.t, nxt[0], 0, ())
            return True
        return False

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

    # ---- turns held at the router (autoscaling, issue 16) ---------------------------------
    def _held_classes(self) -> list[str]:
        """The SLO class of each held turn (what a control is told before it decides)."""
        return [self.sessions[si].slo_class for _, si, _, _ in self.held]

    def _hold_expiry(self) -> float | None:
        """When the first held turn times out (the control's `hold_timeout_s`), if ever."""
        limit = self.control.hold_timeout_s if self.control is not None else 0.0
        return min(at for at, *_ in self.held) + limit if limit > 0 else None

    def _expire_held(self) -> None:
        """Held turns past the control's timeout end at their deadline with DEADLINE_EXCEEDED
        (KEDA's HTTP add-on answers 504 Gateway Timeout when its readiness timeout runs out
        before a replica is ready)."""
        limit = self.control.hold_timeout_s if self.control is not None else 0.0
        if limit <= 0:
            return
        kept = []
        for item in self.held:
            if item[0] + limit <= self.t:
                self._end_held(item, "DEADLINE_EXCEEDED", item[0] + limit)
            else:
                kept.append(item)
        self.held = kept

    def _fail_held(self) -> None:
        """The run is over and the router still holds turns no replica will take (a pool at
        zero its trigger will not wake): UNAVAILABLE."""
        for item in self.held:
            self._end_held(item, "UNAVAILABLE", item[0])
        self.held = []

    def _end_held(self, item: tuple[float, int, int, tuple[int, ...]], error: str,
                  end_s: float) -> None:
        at, si, ti, history = item
        s = self.sessions[si]
        n = len(history) + len(s.turns[ti].user_ids)
        self.out.records.append(failed(turn_id(s, ti), s, ti, at, n, error, -1, end_s))
        self._session_over(si)
