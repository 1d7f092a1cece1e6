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
    max_grammar_bytes: int = 65536,
) -> VirtualRun:
    sched = core.scheduler
    limit = sched.config.max_model_len
    run = VirtualRun()
    arrivals: list[tuple[float, int, int, int, tuple[int, ...]]] = []
    for i, s in enumerate(sessions):
        if s.turns:
            heapq.heappush(arrivals, (s.start_s, i, i, 0, ()))
    seq = len(sessions)
    live: dict[str, tuple[Request, int, int, float]] = {}  # id -> (req, session, turn, arrival)
    first_sched: dict[str, float] = {}
    times: dict[str, list[float]] = {}
    t, busy, usage_area = 0.0, 0.0, 0.0

    def admit(at: float, si: int, ti: int, history: tuple[int, ...]) -> None:
        s, turn = sessions[si], sessions[si].turns[ti]
        rid = f"{s.session_id}/{ti}" if len(s.turns) > 1 else s.session_id
        prompt = history + turn.user_ids
        error, constraint = None, None
        if len(prompt) + turn.max_tokens > limit:
            error = "INVALID_ARGUMENT"
        elif max_waiting is not None and sched.num_waiting >= max_waiting:
            error = "RESOURCE_EXHAUSTED"
        elif s.constraint is not None:
            try:
                constraint = core.constraints.start(s.constraint, max_grammar_bytes)
            except InvalidRequest:
                error = "INVALID_ARGUMENT"
        if error:
            run.records.append(RequestRecord(rid, s.session_id, ti, at, None, (), at,
                                             len(prompt), 0, 0, "error", error=error))
            return
        req = Request(rid, list(prompt), SamplingParams(turn.max_tokens, s.ignore_eos, s.seed),
                      arrival_time=at)
        req.constraint = constraint
        core.add_request(req)
        live[rid] = (req, si, ti, at)
        times[rid] = []

    while arrivals or core.has_unfinished():
        if not core.has_unfinished() and arrivals[0][0] > t:
            core.account_idle(arrivals[0][0] - t)
            t = arrivals[0][0]
        while arrivals and arrivals[0][0] <= t:
            at, _, si, ti, history = heapq.heappop(arrivals)
            admit(at, si, ti, history)
        result = core.step()
        if result is None:
            if not arrivals:
                raise RuntimeError("requests are waiting but none can ever be scheduled")
            core.account_idle(max(0.0, arrivals[0][0] - t))
            t = max(t, arrivals[0][0])
            continue
        for s in result.output.scheduled:
            first_sched.setdefault(s.request_id, t)
        t += result.seconds
        busy += result.seconds
        used = sched.pool.num_used - sched.cache.evictable_blocks
        usage = used / sched.config.num_blocks
        usage_area += usage * result.seconds
        run.kv_usage_peak = max(run.kv_usage_peak, usage)
        for rid, tokens in result.new_tokens.items():
            if rid in times:
                prev = times[rid][-1] if times[rid] else None
                times[rid].extend(spread_times(prev, t, len(tokens)))
        for req in result.finished:
            r, si, ti, at = live.pop(req.request_id)
            run.records.append(RequestRecord(
                req.request_id, sessions[si].session_id, ti, at, first_sched.get(req.request_id),
                tuple(times.pop(req.request_id)), t, r.num_prompt_tokens,
                max(r.num_cached_tokens, 0), r.num_output_tokens,
                (r.finish_reason.value if r.finish_reason else "stop"), r.num_preemptions,
                jump_forward_tokens=r.num_jump_forward_tokens,
            ))
            session = sessions[si]
            if ti + 1 < len(session.turns):
                nxt = session.turns[ti + 1]
                heapq.heappush(arrivals, (t + nxt.think_time_s, seq, si, ti + 1,
                                          tuple(r.token_ids)))
                seq += 1
    run.duration_s = t
    run.kv_usage_mean = usage_area / busy if busy else 0.0
    return run
