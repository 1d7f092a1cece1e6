"""Virtual time: run a workload through an EngineCore as a discrete-event simulation.

No sleeping and no asyncio: the clock jumps from step end to step end (and over idle gaps to
the next arrival). The scheduler, KV cache, device cost model and mock model are the very same
objects the real-time server uses, so the report of a virtual run is the report the server
would give — hours of traffic in seconds of CPU.

The workload is the clients' own `Conversation`s and every request's result the clients' own
`RequestResult` (`clients/conversation.py`, `clients/report.py`): one record type for real
and virtual time, read by the same reports. Turn k+1 of a conversation arrives
`think_time_s` after turn k finished, and its prompt is the whole history (earlier prompts
and the tokens actually generated) followed by the new user message, as a chat client
resends it. A conversation's constraint (structured output) is compiled for each turn as the
server's intake would; one that does not compile is recorded as an INVALID_ARGUMENT error.
Tokens of one step share its interval (`spread_times`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from clients.conversation import Conversation
from clients.report import RequestResult
from server.engine.core import EngineCore, StepResult
from server.engine.intake import queue_is_full
from server.engine.interface import Constraint, InvalidRequest
from server.engine.output import spread_times
from server.engine.request import Request, SamplingParams
from sim.virtual_macro import LastStep, MacroWindows
from sim.virtual_pd import Dispatch, Hop, PdHops

# --- speed (issue 16): macro-stepping unless a caller says otherwise (`simulate
# --no-macro-steps` turns it off for the whole command, clusters included) ---
MACRO_STEPS = {"default": True}

# A cluster's router (sim/routers.py): (prompt token ids, outstanding requests per core, the
# session: its SLO class) -> the index of the core that gets the request; None: hold it (no
# replica is ready, as when an autoscaled pool is at zero; the loop routes it again after the
# control's next tick); or REFUSED: the router's admission sheds it (RESOURCE_EXHAUSTED, as
# `Dispatch.place`'s None). Called at the request's arrival time.
Route = Callable[[Sequence[int], Sequence[int], Conversation], int | None]
REFUSED = -1


class Records(Protocol):
    """Where a run puts each request's result: a list, or a `clients.report.SummaryStream`
    (a million requests summarised in flat memory)."""

    def append(self, result: RequestResult, /) -> None: ...


@dataclass
class VirtualRun:
    records: list[RequestResult] | Records = field(default_factory=list)
    duration_s: float = 0.0
    kv_usage_mean: float = 0.0  # time-weighted over busy steps
    kv_usage_peak: float = 0.0


def run_virtual(
    core: EngineCore, sessions: Iterable[Conversation], max_waiting: int | None = None,
    max_grammar_bytes: int = 65536, concurrency: int | None = None,
    macro_steps: bool | None = None, records: Records | None = None,
) -> VirtualRun:
    """Run `sessions` through `core`. Open loop (default): each session starts at its
    `start_s`. Closed loop (`concurrency=N`): N sessions run at once, back to back, in order;
    when one ends (its last turn finished, or a turn was refused) the next starts.
    `macro_steps` advances windows of plain decode steps together (`macro.py`; default
    `MACRO_STEPS["default"]`); the run is the same with it off (one Python step each), only
    slower. `sessions` is a list, or a lazy `clients.workloads.Workload` (in order of start,
    drawn as they start: with a `SummaryStream` as `records`, memory stays flat)."""
    return run_cluster([core], sessions, lambda prompt, outstanding, s: 0, [max_waiting],
                       [max_grammar_bytes], concurrency, macro_steps=macro_steps,
                       records=records)


def run_cluster(
    cores: list[EngineCore], sessions: Iterable[Conversation], route: Route,
    max_waiting: Sequence[int | None] | None = None,
    max_grammar_bytes: Sequence[int] | None = None, concurrency: int | None = None, *,
    dispatch: Dispatch | None = None,
    control: Control | None = None,
    macro_steps: bool | None = None,
    records: Records | None = None,
) -> VirtualRun:
    """Run `sessions` through several cores on one shared virtual clock: each arriving turn
    goes to the core `route` picks (the per-core limits are indexed like `cores`); whichever
    core's step ends first is advanced next. One core is exactly `run_virtual`. A `dispatch`
    (issue 16: SLO classes, admission, P/D) replaces `route` when given. `control` (an
    autoscaler, sim/autoscale.py) is ticked on its own schedule and says which idle cores are
    paid for."""
    if concurrency is not None and concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if not cores:
        raise ValueError("a cluster needs at least one core")
    n = len(cores)
    runner = _Runner(cores, sessions, route, list(max_waiting or [None] * n),
                     list(max_grammar_bytes or [65536] * n), concurrency)
    if records is not None:
        runner.out.records = records
    runner.dispatch = dispatch  # --- fleet (issue 16) ---
    runner.control = control  # --- autoscale (issue 16) ---
    # --- speed (issue 16): macro-stepping, unless follow-up turns could interleave cores, or
    # P/D hops (a KV transfer ends at a time no window can know when it starts) ---
    macro = MACRO_STEPS["default"] if macro_steps is None else macro_steps
    runner.macro = (macro and (n == 1 or not runner.follow_ups)
                    and not (dispatch is not None and dispatch.pd))
    return runner.run()


# --- autoscale (issue 16) ---
class Control(Protocol):
    """A periodic controller of a cluster run (sim/autoscale.py): `tick(t)` is called once
    the clock reaches `next_at` (after that instant's step ends, before its arrivals), and an
    idle core k is charged idle power and money only while `bill_idle(k, t)` is true (an off
    replica costs nothing). The run ends when the traffic does, whatever `next_at` says.
    `held` is set before each tick to the number of requests the router holds; held requests
    the control says it will never serve (`can_serve_held`) end as UNAVAILABLE."""

    held: int

    @property
    def next_at(self) -> float: ...

    def can_serve_held(self) -> bool: ...

    def tick(self, t: float) -> None: ...

    def bill_idle(self, k: int, t: float) -> bool: ...

    def finish(self, t: float) -> None: ...
# --- end autoscale ---


def _failed(rid: str, s: Conversation, ti: int, at: float, prompt_tokens: int, error: str,
            replica: int) -> RequestResult:
    """A turn refused at its arrival (`error`: the status the server would answer)."""
    return RequestResult(rid, scheduled_s=at, sent_s=at, token_times=(), end_s=at,
                         prompt_tokens=prompt_tokens, output_tokens=0, finish_reason="error",
                         error=error, conversation_id=s.conversation_id, turn=ti,
                         slo_class=s.slo_class, replica=replica)


class _Runner(PdHops, MacroWindows):
    """The event loop. A core's step is computed when it starts (the scheduler's state moves
    on then) and delivered when it ends: token times, finished records and the next turns
    due are all stamped at the step's end. At one instant, step ends come first, then the
    arrivals, then free cores start their next step — for one core, the order of a loop that
    admits what has arrived and steps."""

    def __init__(self, cores: list[EngineCore], sessions: Iterable[Conversation], route: Route,
                 max_waiting: list[int | None], max_grammar_bytes: list[int],
                 concurrency: int | None) -> None:
        self.cores, self.route = cores, route
        self.max_waiting, self.max_grammar_bytes = max_waiting, max_grammar_bytes
        self.outstanding = [0] * len(cores)  # routed, not yet finished (the router's view)
        self.control: Control | None = None  # --- autoscale (issue 16) ---
        self.held: list[tuple[float, int, int, tuple[int, ...]]] = []  # routed nowhere yet
        self.out = VirtualRun()
        # (time, 0, session, ...) a session's first turn in open loop, before (time, 1, seq,
        # ...) any other turn due at that instant, as when every session was queued first
        self.arrivals: list[tuple[float, int, int, int, int, tuple[int, ...]]] = []
        self.seq = 0
        self.live: dict[str, tuple[Request, int, int, float, int]] = {}
        self.first_sched: dict[str, float] = {}
        self.times: dict[str, list[float]] = {}
        self.t = 0.0
        # --- fleet (issue 16): the router's dispatch; P/D requests between their two cores ---
        self.dispatch: Dispatch | None = None
        self.timers: list[tuple[float, int, str]] = []  # (KV transfer end, tie-break, rid)
        self.pd: dict[str, Hop] = {}  # rid -> its P/D hop, from arrival to the decode's start
        # --- speed (issue 16) ---
        self.macro = False
        if isinstance(sessions, list):
            multi = any(len(s.turns) > 1 for s in sessions)
        else:  # a lazy workload says so itself
            multi = bool(getattr(sessions, "multi_turn", True))
        self.follow_ups = concurrency is not None or multi
        self.macro_busy = self.macro_area = 0.0  # the head steps of macro windows
        # --- end speed ---
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

    def admit(self, at: float, si: int, ti: int, history: tuple[int, ...]) -> None:
        s, turn = self.sessions[si], self.sessions[si].turns[ti]
        rid = f"{s.conversation_id}/{ti}" if len(s.turns) > 1 else s.conversation_id
        prompt = history + turn.user_ids
        prefill = None  # --- fleet (issue 16) ---
        if self.dispatch is None:
            k = self.route(prompt, self.outstanding, s)
            if k is None:  # --- autoscale (issue 16): no replica ready: held at the router ---
                self.held.append((at, si, ti, history))
                return
            if k == REFUSED:  # --- autoscale (issue 16): shed by its admission ---
                self._refused(rid, si, ti, at, len(prompt))
                return
        elif (placed := self.dispatch.place(prompt, self.outstanding, s)) is None:
            self._refused(rid, si, ti, at, len(prompt))
            return
        else:
            k, prefill = placed
        core, max_waiting = self.cores[k], self.max_waiting[k]
        sched = core.scheduler
        error, constraint = None, None
        if prefill is not None and (e := self._pd_check(prefill, prompt)):
            error = e
        elif len(prompt) + turn.max_tokens > sched.config.max_model_len:
            error = "INVALID_ARGUMENT"
        elif max_waiting is not None and queue_is_full(sched.num_waiting, sched.free_seats,
                                                       max_waiting):
            error = "RESOURCE_EXHAUSTED"
        elif s.constraint is not None:
            try:
                constraint = core.constraints.start(Constraint(s.constraint[0],  # type: ignore[arg-type]
                                                               text=s.constraint[1]),
                                                    self.max_grammar_bytes[k])
            except InvalidRequest:
                error = "INVALID_ARGUMENT"
        if error:
            self.out.records.append(_failed(rid, s, ti, at, len(prompt), error, k))
            self._session_over(si)  # the session cannot go on without this turn
            return
        params = SamplingParams(max_tokens=turn.max_tokens, ignore_eos=s.ignore_eos, seed=s.seed)
        req = Request(rid, list(prompt), params, arrival_time=at)
        req.constraint = constraint
        self.outstanding[k] += 1
        if prefill is not None:  # --- fleet (issue 16): prefilled elsewhere first ---
            self._start_prefill(prefill, k, req, si, ti, at)
            return
        core.add_request(req)
        self.live[rid] = (req, si, ti, at, k)
        self.times[rid] = []

    def finished(self, req: Request) -> None:
        hop = self.pd.get(req.request_id)  # --- fleet (issue 16) ---
        if hop is not None and hop.prefill_end_s is None:
            self._prefilled(hop, req)
            return
        r, si, ti, at, k = self.live.pop(req.request_id)
        self.outstanding[k] -= 1
        if hop is not None:
            del self.pd[req.request_id]
            self._record(r, si, ti, at, k, prefill_replica=hop.prefill,
                         prefill_end_s=hop.prefill_end_s, kv_transfer_s=hop.kv_transfer_s)
        else:
            self._record(r, si, ti, at, k)
        session = self.sessions[si]
        if ti + 1 < len(session.turns):
            self._due(self.t + session.turns[ti + 1].think_time_s, si, ti + 1,
                      tuple(r.token_ids))
        else:
            self._session_over(si)

    def _record(self, r: Request, si: int, ti: int, at: float, k: int, **pd) -> None:
        self.out.records.append(RequestResult(
            r.request_id, scheduled_s=at, sent_s=at,
            token_times=tuple(self.times.pop(r.request_id)), end_s=self.t,
            prompt_tokens=r.num_prompt_tokens, output_tokens=r.num_output_tokens,
            cached_tokens=max(r.num_cached_tokens, 0),
            jump_forward_tokens=r.num_jump_forward_tokens,
            finish_reason=r.finish_reason.value if r.finish_reason else "stop",
            conversation_id=self.sessions[si].conversation_id, turn=ti,
            slo_class=self.sessions[si].slo_class,
            first_scheduled_s=self.first_sched.pop(r.request_id, None),
            preemptions=r.num_preemptions, replica=k, **pd,
        ))

    def run(self) -> VirtualRun:
        cores, arrivals = self.cores, self.arrivals
        n = len(cores)
        ends: list[float | None] = [None] * n  # when each core's running step ends
        results: list[StepResult | LastStep | None] = [None] * n
        busy = usage_area = 0.0
        while True:
            for k, core in enumerate(cores):  # every free core with work starts a step
                if ends[k] is None and core.has_unfinished():
                    result = self._window(core, k) if self.macro else None  # speed (issue 16)
                    result = result or core.step()
                    if result is None:
                        continue  # blocked until something changes
                    for s in result.output.scheduled:
                        self.first_sched.setdefault(s.request_id, self.t)
                    sched = core.scheduler
                    usage = ((sched.pool.num_used - sched.cache.evictable_blocks)
                             / sched.config.num_blocks)
                    usage_area += usage * result.seconds
                    busy += result.seconds
                    self.out.kv_usage_peak = max(self.out.kv_usage_peak, usage)
                    ends[k], results[k] = getattr(result, "end", self.t + result.seconds), result
            due = [e for e in ends if e is not None]
            if arrivals:
                due.append(arrivals[0][0])
            if self.timers:  # --- fleet (issue 16): KV transfers ending ---
                due.append(self.timers[0][0])
            ctl = self.control  # --- autoscale (issue 16): its ticks are events too ---
            if not due and not (self.held and ctl is not None and ctl.can_serve_held()):
                self._fail_held()
                if any(core.has_unfinished() for core in cores):
                    raise RuntimeError("requests are waiting but none can be scheduled")
                break
            if ctl is not None:
                due.append(ctl.next_at)
            t = max(self.t, min(due))
            for k, core in enumerate(cores):  # free cores sit idle until then
                if ends[k] is None and (ctl is None or ctl.bill_idle(k, self.t)):
                    core.account_idle(t - self.t)
            self.t = t
            for k in range(n):
                if ends[k] is not None and ends[k] <= t:
                    self.deliver(results[k])
                    ends[k] = results[k] = None
            while self.timers and self.timers[0][0] <= self.t:  # --- fleet (issue 16) ---
                self._decode(self.pd[heapq.heappop(self.timers)[2]])
            if ctl is not None and self.t >= ctl.next_at:  # --- autoscale (issue 16) ---
                ctl.held = len(self.held)
                ctl.tick(self.t)
                held, self.held = self.held, []
                for item in held:  # routed again, in order of arrival (or held again)
                    self.admit(*item)
            while arrivals and arrivals[0][0] <= self.t:
                at, first, _, si, ti, history = heapq.heappop(arrivals)
                if first == 0 and self.lazy:
                    self._pull()
                self.admit(at, si, ti, history)
        self.out.duration_s = self.t
        if self.control is not None:  # --- autoscale (issue 16) ---
            self.control.finish(self.t)
        busy, usage_area = busy + self.macro_busy, usage_area + self.macro_area  # speed
        self.out.kv_usage_mean = usage_area / busy if busy else 0.0
        return self.out

    def _fail_held(self) -> None:
        """The run is over and the router still holds requests no replica will take (a pool
        at zero its trigger will not wake): UNAVAILABLE, as a gateway's timeout answers."""
        for at, si, ti, history in self.held:
            s = self.sessions[si]
            rid = f"{s.conversation_id}/{ti}" if len(s.turns) > 1 else s.conversation_id
            n = len(history) + len(s.turns[ti].user_ids)
            self.out.records.append(_failed(rid, s, ti, at, n, "UNAVAILABLE", -1))
            self._session_over(si)
        self.held = []

    # --- fleet (issue 16): refusals at the router, and the P/D hop ---------------------------
    def _refused(self, rid: str, si: int, ti: int, at: float, n: int) -> None:
        """Refused by the router's admission: a record on no core (replica -1), no KV."""
        s = self.sessions[si]
        self.out.records.append(_failed(rid, s, ti, at, n, "RESOURCE_EXHAUSTED", -1))
        self._session_over(si)

    # --- end fleet (issue 16) -------------------------------------------------------------

    def deliver(self, result: StepResult | LastStep | None) -> None:
        """A step's outputs, at its end (`self.t`)."""
        assert result is not None
        for rid, tokens in result.new_tokens.items():
            if rid in self.times:
                prev = self.times[rid][-1] if self.times[rid] else None
                self.times[rid].extend(spread_times(prev, self.t, len(tokens)))
        for req in result.finished:
            self.finished(req)

