"""The virtual-time event loop's macro windows (issue 16, speed): a core advanced by a window
of decode steps at once (`server.engine.macro.advance`), its steps delivered as single steps
would have been.

Why it exists apart from `sim.virtual`: the window is one concern — when one may start (the
next outside event bounds it), and how its K steps reach the records — and the loop stays
readable. `MacroWindows` is a mixin of `virtual._Runner`: it reads the runner's `arrivals`,
`timers`, `control`, `t`, `follow_ups`, `times`, `out`, and in a P/D fleet `feeders` (its
prefill cores), `ends` and `cores`; calls its `finished`, and adds to
its `macro_busy`/`macro_area` (the head steps' busy time and KV-usage area).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from server.engine.core import EngineCore, StepResult
from server.engine.macro import Window, advance
from server.engine.request import Request
from server.engine.scheduler_config import SchedulerOutput

if TYPE_CHECKING:
    from sim.virtual import Control, VirtualRun

MIN_WINDOW = 3  # mean steps before the next arrival below which single steps are cheaper
_NOTHING_SCHEDULED = SchedulerOutput((), ())


@dataclass
class LastStep:
    """A macro window's last step, as the loop's `deliver` reads a `StepResult`: it is in
    flight until `end` (the window's head steps were delivered when it started)."""

    seconds: float
    end: float
    new_tokens: dict[str, list[int]]
    finished: list[Request]
    output: SchedulerOutput = _NOTHING_SCHEDULED  # first schedulings: noted by _deliver_window


class MacroWindows:
    """The window half of the event loop (see the module docstring)."""

    arrivals: list
    timers: list
    feeders: list[int]
    ends: list[float | None]
    cores: list[EngineCore]
    control: Control | None
    t: float
    follow_ups: bool
    times: dict[str, list[float]]
    first_sched: dict[str, float]
    out: VirtualRun
    macro_busy: float
    macro_area: float

    def finished(self, req: Request) -> None: ...

    def _window(self, core: EngineCore, k: int) -> LastStep | StepResult | None:
        """Advance `core` by a window of decode steps from now; deliver all but its last step
        here (at their own end times: nothing else happens before the next arrival, and no
        finish can start another turn), and return the last as the step in flight. (An
        admission step the window could not continue comes back as the `StepResult` of
        that one step, already run.)"""
        # the next event that changes a batch from outside: an arrival, an autoscaler's tick
        # (it reads every replica's queue and KV then); no KV load is in flight in a window
        due = [self.arrivals[0][0]] if self.arrivals else []
        if self.control is not None:
            due.append(self.control.next_at)
        for j in self.feeders:  # P/D: a prefill core's step end may start a KV transfer here
            if j != k:
                end = self.ends[j]
                if end is not None:
                    due.append(end)
                elif self.cores[j].has_unfinished():
                    return None  # it starts a step at this instant: its end is not known yet
        until = min(due) if due else None
        st = core.stats
        if until is not None and st.steps and until - self.t < MIN_WINDOW * st.busy_s / st.steps:
            return None  # a window of a step or two costs more than single steps
        window = advance(core, self.t, until, self.follow_ups)
        if window is None or isinstance(window, StepResult):
            return window  # (an admission step a window cannot continue: run as one step)
        return self._deliver_window(window, k)

    def _deliver_window(self, w: Window, k: int) -> LastStep:
        seconds, usage, times, t0 = w.seconds, w.usage, self.times, self.t
        if w.admission is not None:  # it began by admitting: they were first scheduled now
            for s in w.admission.scheduled:
                self.first_sched.setdefault(s.request_id, t0)
        ends, t = [], t0
        for s in seconds:
            t += s
            ends.append(t)
        head = len(seconds) - 1
        busy = area = 0.0
        for s, u in zip(seconds[:head], usage[:head], strict=False):
            busy += s
            area += u * s
        self.macro_busy += busy
        self.macro_area += area
        if usage[:head]:
            self.out.kv_usage_peak = max(self.out.kv_usage_peak, max(usage[:head]))
        new_tokens: dict[str, list[int]] = {}
        for req, last in w.requests:
            rid = req.request_id
            if rid in times:
                times[rid].extend(ends[:min(last + 1, head)])
                if last == head:
                    new_tokens[rid] = [req.token_ids[-1]]
        for j in range(head):
            for req in w.finished.get(j, ()):
                self.t = ends[j]
                self.finished(req)
        self.t = t0
        return LastStep(seconds[head], ends[head], new_tokens, w.finished.get(head, []))
