"""Virtual time: run a workload through an EngineCore as a discrete-event simulation.

No sleeping and no asyncio: the clock jumps from step end to step end (and over idle gaps to
the next arrival). The scheduler, KV cache, device cost model and mock model are the very same
objects the real-time server uses, so the report of a virtual run is the report the server
would give — hours of traffic in seconds of CPU.

Sessions are conversations: turn k+1 arrives `think_time_s` after turn k finished, and its
prompt is the whole history (earlier prompts and the tokens actually generated) followed by
the new user message, as a chat client resends it. A session's constraint (structured output)
is compiled for each turn as the server's intake would; one that does not compile is recorded
as an INVALID_ARGUMENT error. Tokens of one step share its interval (`spread_times`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from server.engine.core import EngineCore
from server.engine.intake import queue_is_full
from server.engine.interface import Constraint, InvalidRequest
from server.engine.output import spread_times
from server.engine.request import Request, SamplingParams


@dataclass(frozen=True)
class VirtualTurn:
    user_ids: tuple[int, ...]
    max_tokens: int
    think_time_s: float = 0.0


@dataclass(frozen=True)
class VirtualSession:
    session_id: str
    start_s: float
    turns: tuple[VirtualTurn, ...]
    ignore_eos: bool = True
    seed: int = 0
    constraint: Constraint | None = None  # structured output, for every turn


@dataclass(frozen=True)
class RequestRecord:
    """One request of a virtual run, on the emulated timeline (seconds from the start)."""

    request_id: str
    session_id: str
    turn: int
    arrival_s: float
    first_scheduled_s: float | None
    token_times: tuple[float, ...]
    end_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    finish_reason: str
    preemptions: int = 0
    error: str | None = None  # the status code the server would have answered
    jump_forward_tokens: int = 0


@dataclass
class VirtualRun:
    records: list[RequestRecord] = field(default_factory=list)
    duration_s: float = 0.0
    kv_usage_mean: float = 0.0  # time-weighted over busy steps
    kv_usage_peak: float = 0.0


def run_virtual(
    core: EngineCore, sessions: list[VirtualSession], max_waiting: int | None = None,
    max_grammar_bytes: int = 65536, concurrency: int | None = None,
) -> VirtualRun:
    """Run `sessions` through `core`. Open loop (default): each session starts at its
    `start_s`. Closed loop (`concurrency=N`): N sessions run at once, back to back, in order;
    when one ends (its last turn finished, or a turn was refused) the next starts."""
    if concurrency is not None and concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    return _Runner(core, sessions, max_waiting, max_grammar_bytes, concurrency).run()


class _Runner:
    def __init__(self, core: EngineCore, sessions: list[VirtualSession],
                 max_waiting: int | None, max_grammar_bytes: int,
                 concurrency: int | None) -> None:
        self.core, self.sessions = core, sessions
        self.max_waiting, self.max_grammar_bytes = max_waiting, max_grammar_bytes
        self.out = VirtualRun()
        # (time, tie-break, session, turn, history): the next turns due
        self.arrivals: list[tuple[float, int, int, int, tuple[int, ...]]] = []
        self.seq = 0
        self.live: dict[str, tuple[Request, int, int, float]] = {}
        self.first_sched: dict[str, float] = {}
        self.times: dict[str, list[float]] = {}
        self.t = 0.0
        order = [i for i, s in enumerate(sessions) if s.turns]
        if concurrency is None:
            for i in order:
                self._due(sessions[i].start_s, i, 0, ())
            self.pending: list[int] = []
        else:
            self.pending = order[::-1]  # popped from the end: in order
            for _ in range(min(concurrency, len(order))):
                self._next_session()

    def _due(self, at: float, si: int, ti: int, history: tuple[int, ...]) -> None:
        heapq.heappush(self.arrivals, (at, self.seq, si, ti, history))
        self.seq += 1

    def _next_session(self) -> None:
        """Closed loop: the next session in line starts now."""
        if self.pending:
            self._due(self.t, self.pending.pop(), 0, ())

    def admit(self, at: float, si: int, ti: int, history: tuple[int, ...]) -> None:
        s, turn = self.sessions[si], self.sessions[si].turns[ti]
        rid = f"{s.session_id}/{ti}" if len(s.turns) > 1 else s.session_id
        prompt = history + turn.user_ids
        sched = self.core.scheduler
        error, constraint = None, None
        if len(prompt) + turn.max_tokens > sched.config.max_model_len:
            error = "INVALID_ARGUMENT"
        elif self.max_waiting is not None and queue_is_full(sched.num_waiting, sched.free_seats,
                                                            self.max_waiting):
            error = "RESOURCE_EXHAUSTED"
        elif s.constraint is not None:
            try:
                constraint = self.core.constraints.start(s.constraint, self.max_grammar_bytes)
            except InvalidRequest:
                error = "INVALID_ARGUMENT"
        if error:
            self.out.records.append(RequestRecord(rid, s.session_id, ti, at, None, (), at,
                                                  len(prompt), 0, 0, "error", error=error))
            self._next_session()  # the session cannot go on without this turn
            return
        params = SamplingParams(max_tokens=turn.max_tokens, ignore_eos=s.ignore_eos, seed=s.seed)
        req = Request(rid, list(prompt), params, arrival_time=at)
        req.constraint = constraint
        self.core.add_request(req)
        self.live[rid] = (req, si, ti, at)
        self.times[rid] = []

    def finished(self, req: Request) -> None:
        r, si, ti, at = self.live.pop(req.request_id)
        self.out.records.append(RequestRecord(
            req.request_id, self.sessions[si].session_id, ti, at,
            self.first_sched.get(req.request_id), tuple(self.times.pop(req.request_id)), self.t,
            r.num_prompt_tokens, max(r.num_cached_tokens, 0), r.num_output_tokens,
            (r.finish_reason.value if r.finish_reason else "stop"), r.num_preemptions,
            jump_forward_tokens=r.num_jump_forward_tokens,
        ))
        session = self.sessions[si]
        if ti + 1 < len(session.turns):
            self._due(self.t + session.turns[ti + 1].think_time_s, si, ti + 1,
                      tuple(r.token_ids))
        else:
            self._next_session()

    def run(self) -> VirtualRun:
        core, sched, arrivals = self.core, self.core.scheduler, self.arrivals
        busy = usage_area = 0.0
        while arrivals or core.has_unfinished():
            if not core.has_unfinished() and arrivals[0][0] > self.t:
                core.account_idle(arrivals[0][0] - self.t)
                self.t = arrivals[0][0]
            while arrivals and arrivals[0][0] <= self.t:
                at, _, si, ti, history = heapq.heappop(arrivals)
                self.admit(at, si, ti, history)
            result = core.step()
            if result is None:
                if not arrivals:
                    if core.has_unfinished():
                        raise RuntimeError("requests are waiting but none can be scheduled")
                    continue
                core.account_idle(max(0.0, arrivals[0][0] - self.t))
                self.t = max(self.t, arrivals[0][0])
                continue
            for s in result.output.scheduled:
                self.first_sched.setdefault(s.request_id, self.t)
            self.t += result.seconds
            busy += result.seconds
            usage = (sched.pool.num_used - sched.cache.evictable_blocks) / sched.config.num_blocks
            usage_area += usage * result.seconds
            self.out.kv_usage_peak = max(self.out.kv_usage_peak, usage)
            for rid, tokens in result.new_tokens.items():
                if rid in self.times:
                    prev = self.times[rid][-1] if self.times[rid] else None
                    self.times[rid].extend(spread_times(prev, self.t, len(tokens)))
            for req in result.finished:
                self.finished(req)
        self.out.duration_s = self.t
        self.out.kv_usage_mean = usage_area / busy if busy else 0.0
        return self.out
