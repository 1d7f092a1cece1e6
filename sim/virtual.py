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

from collections.abc import Iterable, Sequence

from clients.conversation import Conversation
from server.engine.core import EngineCore, StepResult
from server.engine.errors import InvalidRequest
from server.engine.intake import queue_is_full
from server.engine.interface import Constraint
from server.engine.output import spread_times
from server.engine.request import Request, SamplingParams
from sim.virtual_macro import LastStep, MacroWindows
from sim.virtual_pd import Dispatch, Hop, PdHops
from sim.virtual_sessions import SessionSource
from sim.virtual_types import (
    HELD,
    REFUSED,
    Control,
    Records,
    Route,
    VirtualRun,
    completed,
    failed,
    turn_id,
)

# --- speed (issue 16): macro-stepping unless a caller says otherwise (`simulate
# --no-macro-steps` turns it off for the whole command, clusters included) ---
MACRO_STEPS = {"default": True}

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
    # --- speed (issue 16): macro-stepping, unless follow-up turns could interleave cores; a
    # P/D fleet's windows also end at its prefill cores' step ends (`feeders`: a prefill
    # ending there starts a KV transfer, whose end is an arrival for a decode core) ---
    macro = MACRO_STEPS["default"] if macro_steps is None else macro_steps
    runner.macro = macro and (n == 1 or not runner.follow_ups)
    if dispatch is not None and dispatch.pd:
        runner.feeders = list(dispatch.prefill_cores)
        runner._attach_pulls()
    return runner.run()


class _Runner(SessionSource, PdHops, MacroWindows):
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
        self.live: dict[str, tuple[Request, int, int, float, int]] = {}
        self.first_sched: dict[str, float] = {}
        self.times: dict[str, list[float]] = {}
        self.t = 0.0
        # --- fleet (issue 16): the router's dispatch; P/D requests between their two cores ---
        self.dispatch: Dispatch | None = None
        self.pd: dict[str, Hop] = {}  # rid -> its P/D hop, from arrival to the decode's start
        # --- speed (issue 16) ---
        self.macro = False
        self.feeders: list[int] = []  # P/D: cores whose step ends bound other cores' windows
        self.ends: list[float | None] = [None] * len(cores)
        if isinstance(sessions, list):
            multi = any(len(s.turns) > 1 for s in sessions)
        else:  # a lazy workload says so itself
            multi = bool(getattr(sessions, "multi_turn", True))
        self.follow_ups = concurrency is not None or multi
        self.macro_busy = self.macro_area = 0.0  # the head steps of macro windows
        # --- end speed ---
        self._start_sessions(sessions, concurrency)  # virtual_sessions

    def admit(self, at: float, si: int, ti: int, history: tuple[int, ...]) -> None:
        s, turn = self.sessions[si], self.sessions[si].turns[ti]
        rid = turn_id(s, ti)
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
        elif placed is HELD:  # --- autoscale (issue 16): a P/D role has no ready replica ---
            self.held.append((at, si, ti, history))
            return
        else:
            k, prefill = placed
        core, max_waiting = self.cores[k], self.max_waiting[k]
        sched = core.scheduler
        error, constraint = None, None
        if prefill is not None and (e := self._pd_check(prefill, prompt)):
            error = e
        elif len(prompt) + (0 if (pooling := core.placement.model.is_pooling)
                            else turn.max_tokens) > sched.config.max_model_len:
            error = "INVALID_ARGUMENT"  # (a pooling model's request generates nothing)
        elif max_waiting is not None and queue_is_full(sched.num_waiting, sched.free_seats,
                                                       max_waiting):
            error = "RESOURCE_EXHAUSTED"
        elif core.queue_limits.active and core.queue_limits.refusal(
                [*sched.waiting, *sched.running]) is not None:
            error = "UNAVAILABLE"  # vLLM's queue limits: 503, retry elsewhere
        elif s.constraint is not None:
            try:
                constraint = core.constraints.start(Constraint(s.constraint[0],  # type: ignore[arg-type]
                                                               text=s.constraint[1]),
                                                    self.max_grammar_bytes[k])
            except InvalidRequest:
                error = "INVALID_ARGUMENT"
        if error:
            self.out.records.append(failed(rid, s, ti, at, len(prompt), error, k))
            self._session_over(si)  # the session cannot go on without this turn
            return
        params = SamplingParams(max_tokens=turn.max_tokens, ignore_eos=s.ignore_eos, seed=s.seed)
        req = Request(rid, list(prompt), params, arrival_time=at)
        req.constraint = constraint
        req.pooling = pooling  # an embedding model: it ends with its prefill (docs/EMBEDDINGS)
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
        if r.pooling:  # its vector is its one output, as vLLM's metrics record it (TTFT)
            self.times[r.request_id] = [self.t]
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
        self.out.records.append(completed(r, self.sessions[si], ti, at, self.t,
                                          self.times.pop(r.request_id),
                                          self.first_sched.pop(r.request_id, None), k, **pd))

    def run(self) -> VirtualRun:
        cores, arrivals = self.cores, self.arrivals
        n = len(cores)
        self.ends = ends = [None] * n  # when each core's running step ends (None: free)
        results: list[StepResult | LastStep | None] = [None] * n
        for k, core in enumerate(cores):  # a cold core builds first: paid for, serving nothing
            if core.startup_s > 0:
                ends[k], results[k] = core.startup_s, LastStep(0.0, core.startup_s, {}, [])
                core.account_idle(core.startup_s)
        busy = usage_area = 0.0
        while True:
            load_end = None  # the first end of a CPU-tier load a blocked core waits for
            for k, core in enumerate(cores):  # every free core with work starts a step
                if ends[k] is None and core.has_unfinished():
                    result = self._window(core, k) if self.macro else None  # speed (issue 16)
                    result = result or core.step(self.t)
                    if result is None:  # blocked until something changes: an arrival, or
                        d = core.next_deadline()  # a KV load's end (CPU tier, P/D pull)
                        if d is not None and (load_end is None or d < load_end):
                            load_end = d
                        continue
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
            if load_end is not None:
                due.append(load_end)
            if arrivals:
                due.append(arrivals[0][0])
            ctl = self.control  # --- autoscale (issue 16): its ticks are events too ---
            if self.held and (expiry := self._hold_expiry()) is not None:
                due.append(expiry)  # --- autoscale (issue 16): a held turn times out ---
            if ctl is not None:
                ctl.held = self._held_classes()
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
            if self.held:  # --- autoscale (issue 16) ---
                self._expire_held()
            if ctl is not None and self.t >= ctl.next_at:  # --- autoscale (issue 16) ---
                ctl.held = self._held_classes()
                ctl.tick(self.t)
                held, self.held = self.held, []
                for item in held:  # routed again, in order of arrival (or held again)
                    self.admit(*item)
            for at, _, _, si, ti, history in self._arrived():
                self.admit(at, si, ti, history)
        self.out.duration_s = self.t
        if self.control is not None:  # --- autoscale (issue 16) ---
            self.control.finish(self.t)
        busy, usage_area = busy + self.macro_busy, usage_area + self.macro_area  # speed
        self.out.kv_usage_mean = usage_area / busy if busy else 0.0
        return self.out

    # --- fleet (issue 16): refusals at the router, and the P/D hop ---------------------------
    def _refused(self, rid: str, si: int, ti: int, at: float, n: int) -> None:
        """Refused by the router's admission: a record on no core (replica -1), no KV."""
        s = self.sessions[si]
        self.out.records.append(failed(rid, s, ti, at, n, "RESOURCE_EXHAUSTED", -1))
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

