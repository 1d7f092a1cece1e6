"""Macro-stepping: a window of decode-only engine steps advanced together, identical to one by
one.

Why it exists: between the events that change a batch (an arrival, an admission, a preemption,
a prefill chunk, a constrained or speculative request) every step of a virtual run is the
same decode batch one token further on. Single-stepping pays the scheduler's loop, the
sampling and the update in Python for each of those steps; `advance` takes the window's
tokens for the whole batch from one NumPy pass (`MockModel.window`, which reuses the draws
it kept from earlier windows where they cover the steps this one is expected to run: the
very tokens `next_token` draws), finds in closed form the step at which each request
crosses a block boundary or ends (EOS or length), and replays only those events — the same
`allocate_slots` / `cache_blocks` calls in the same order as `Scheduler.schedule` makes
them, so block ids, prefix-cache insertions, LRU times and evictions are the same — and the
finishes as `Scheduler.update` makes them. Each step is priced by the same `cycle_cost`, compile
strategy and jitter, so times and counters are the same floats.

A window may begin with the step that admits waiting requests (`macro_head.py`): the
scheduler decides it for real, and the requests it prefilled whole decode in the window's
later steps like the others.

Contract: `advance` either returns None having changed nothing (the next step is neither a
plain decode batch nor an admission over one), or runs K >= 1 steps exactly as K calls of
`EngineCore.step` would — same tokens, scheduler, pool, cache and core state — and returns
them as a `Window`, or (an admission step a window cannot continue) runs that one step as
`EngineCore.step` and returns its `StepResult`. It stops after the first step ending at or
after `until`, after the first step that finishes a request when `stop_at_finish` (or when a
waiting request would be admitted next), before a step whose block allocations the pool
(free plus evictable) cannot cover (the scheduler then preempts), and after the steps its
tokens cover: at most `LAG + 1`, and fewer when the draws kept from an earlier step or window
cover the steps estimated to run before `until` (from the last window's step time) — then
nothing is drawn, and a window that stops short is followed by another.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

import numpy as np

from devices.cost_window import BOUNDS, DecodeCosts, decode_costs
from server.engine.core import EngineCore, StepResult
from server.engine.macro_head import (
    admits_next,
    head_step,
    no_admission_next,
    plain_core,
    plain_decodes,
)
from server.engine.mock_model import LAG
from server.engine.request import FinishReason, Request, RequestStatus
from server.engine.scheduler_config import SchedulerOutput

HORIZON = LAG + 1  # steps one window draws at most (MockModel.draw_ahead's limit)
_MARGIN = 2  # steps added to a window's estimated length (its steps shorten as requests end)


@dataclass
class Window:
    """The K steps `advance` ran, for the virtual runner: each step's seconds and the KV
    usage after it; each request of the batch with the index of its last step in the window
    (it got one token per step up to it); the finished requests by step."""

    seconds: list[float]
    usage: list[float]
    requests: list[tuple[Request, int]]
    finished: dict[int, list[Request]] = field(default_factory=dict)
    admission: SchedulerOutput | None = None  # the admission step it began with (macro_head.py)


def eligible(core: EngineCore) -> bool:
    """Whether the next step is a plain decode batch with no admission and nothing a window
    cannot reproduce (then every step is one, until an event)."""
    running = core.scheduler.running
    return (bool(running) and len(running) <= core.scheduler.config.max_num_batched_tokens
            and plain_core(core) and no_admission_next(core) and plain_decodes(core, running))


def advance(core: EngineCore, t: float, until: float | None,
            stop_at_finish: bool) -> Window | StepResult | None:
    """Run decode steps from time `t` (see the module's contract)."""
    head = None
    if not eligible(core):
        if not admits_next(core):
            return None
        head = head_step(core, t)  # the admission step, scheduled for real (macro_head.py)
        if isinstance(head, StepResult):
            return head
    lo = 1 if head else 0  # the window's first decode-only step
    sched = core.scheduler
    cfg, kv, pool, cache = sched.config, sched.kv, sched.pool, sched.cache
    running = list(sched.running)
    bs, max_len, eos = kv.block_size, cfg.max_model_len, core.model.eos_token_id
    # the step (0-based) at which each request ends by length; the window's horizon
    # (min(max_tokens - outputs, max_len - length) - 1, with outputs = length - prompt)
    by_length = [min(r.sampling_params.max_tokens + r.num_prompt_tokens, max_len)
                 - len(r.token_ids) - 1 for r in running]
    k = min(HORIZON, max(by_length) + 1)
    need = k  # the steps the kept draws must cover not to draw again: those before `until`
    if until is not None and core.decode_step_s:  # (estimated: a shorter window just stops)
        need = min(k, int((until - t) / core.decode_step_s) + _MARGIN)
    tokens = core.model.window(running, k, need)
    k = min(k, min(map(len, tokens)))
    last = []  # the step at which each request finishes (or k: not in this window)
    for row, lim in zip(tokens, by_length, strict=True):
        end = min(lim, k - 1)
        try:
            end = row.index(eos, 0, end + 1)
        except ValueError:
            if end < lim:
                end = k
        last.append(end)
    finish_at: dict[int, list[int]] = {}
    for i, f in enumerate(last):
        if f < k:
            finish_at.setdefault(f, []).append(i)
    # each step's batch (size, summed context) while no allocation cuts the window short
    starts = [r.num_computed_tokens for r in running]
    ending_n, ending_c = [0] * k, [0] * k  # requests (their first contexts) leaving per step
    for f, c in zip(last, starts, strict=True):
        f = min(f, k - 1)
        ending_n[f] += 1
        ending_c[f] += c + 1
    alive_n, ctx = [0] * k, [0] * k  # whole numbers: exact as floats, in any order
    a = b = 0
    for j in range(k - 1, -1, -1):
        a += ending_n[j]
        b += ending_c[j]
        alive_n[j], ctx[j] = a, b + j * a
    costs = decode_costs(core.placement, np.array(alive_n[lo:]),
                         np.array(ctx[lo:], np.float64)) if k > lo else None
    seconds = [head.seconds] if head else []
    if costs is not None:
        seconds += costs.seconds.tolist()
    ends = []  # each step's end: t + s_0 + ... + s_j, added left to right (as np.cumsum)
    for s in seconds:
        t += s
        ends.append(t)
    n_steps = min(max(last), k - 1) + 1  # after the last request ends, nothing runs
    if until is not None:
        n_steps = min(n_steps, bisect_left(ends, until) + 1)
    if (stop_at_finish or sched.waiting) and finish_at:
        n_steps = min(n_steps, min(finish_at) + 1)
    events = _block_events(running, n_steps, bs, cache.enabled)
    finished: dict[int, list[Request]] = {}
    usage_at: list[tuple[int, float]] = [(0, (pool.num_used - cache.evictable_blocks)
                                          / cfg.num_blocks)]
    done = n_steps
    for j in sorted(events.keys() | {f for f in finish_at if f < n_steps}):
        step_events = [(i, a) for i, a in events.get(j, ()) if last[i] >= j]
        if step_events:
            if (sum([a for _, a in step_events])  # (a list: faster than a generator here)
                    > pool.num_free + cache.evictable_blocks):
                done = j  # an allocation would preempt: the scheduler decides that
                break
            for i, alloc in step_events:
                req = running[i]
                end = starts[i] + j + 1
                if len(req.token_ids) < end:  # the tokens up to this step, for the cache
                    req.token_ids.extend(tokens[i][len(req.token_ids) - starts[i] - 1:j])
                req.num_computed_tokens = end - 1
                if alloc and not kv.allocate_slots(req, 1):  # cannot fail: checked above
                    raise AssertionError("macro step: a checked allocation failed")
                kv.cache_blocks(req, end)
        ending = finish_at.get(j)
        if ending:
            finished[j] = [_finish(sched, running[i], starts[i], tokens[i], j) for i in ending]
        usage_at.append((j, (pool.num_used - cache.evictable_blocks) / cfg.num_blocks))
    if not done:
        assert head is None, "macro step: the admission step's window ran no step"
        return None
    if done > lo:
        assert costs is not None
        core.decode_step_s = float(costs.seconds[done - 1 - lo])
        _account(core, costs, done - lo)
    stats = sched.stats
    stats.num_steps += done - lo  # (the admission step counted itself in `schedule`)
    stats.num_lora_deferred = 0
    usage = []
    for (_, u), (j1, _) in zip(usage_at, [*usage_at[1:], (done, 0.0)], strict=True):
        usage.extend([u] * (min(j1, done) - len(usage)))
    alive = [i for i in range(len(running)) if last[i] >= done]
    n_tokens = 0
    for i in alive:  # still running: their tokens and computed counts up to the last step
        req, c = running[i], starts[i]
        del req.token_ids[c + 1:]
        req.token_ids.extend(tokens[i][:done])
        req.num_computed_tokens = c + done
        n_tokens += done
    for f, reqs in finished.items():
        n_tokens += (f + 1) * len(reqs)
    stats.num_generation_tokens += n_tokens
    if finished:
        gone = {id(r) for reqs in finished.values() for r in reqs}
        sched.running = [r for r in sched.running if id(r) not in gone]
        stats.num_finished += len(gone)
    return Window(seconds[:done], usage,
                  [(running[i], min(last[i], done - 1)) for i in range(len(running))], finished,
                  head.output if head else None)


def _account(core: EngineCore, costs: DecodeCosts, k: int) -> None:
    """`EngineCore._account` of the first `k` steps (no stall, no jitter: busy = seconds)."""
    s = core.stats
    add = np.add.reduce  # what ndarray.sum() calls, without its Python wrapper
    seconds = costs.seconds[:k]
    s.steps += k
    busy = float(add(seconds))
    s.busy_s += busy
    s.joules += float(add(costs.joules[:k]))
    s.dollars += float(add(costs.dollars[:k]))
    s.bytes += float(add(costs.bytes[:k]))
    s.flops += float(add(costs.flops[:k]))
    s.compiles = core.compiler.compiles
    bound = costs.bound[:k].tolist()
    lo, hi = min(bound), max(bound)
    if lo == hi:  # nearly always one bound for the whole window
        name = BOUNDS[lo]
        s.bound_s[name] = s.bound_s.get(name, 0.0) + busy
        return
    for b in range(lo, hi + 1):
        part = seconds[costs.bound[:k] == b]
        if len(part):
            name = BOUNDS[b]
            s.bound_s[name] = s.bound_s.get(name, 0.0) + float(add(part))


def _finish(sched, req: Request, start: int, tokens: list[int], j: int) -> Request:
    """`Scheduler.update`'s end of a request at window step `j` (its token appended)."""
    del req.token_ids[start + 1:]
    req.token_ids.extend(tokens[:j + 1])
    req.num_computed_tokens = start + j + 1
    reason = req.stop_reason(tokens[j], sched.eos_token_id, sched.config.max_model_len)
    assert reason is not None, "macro step: a request ended without a stop reason"
    if req.hold_kv and reason is FinishReason.LENGTH:
        sched._hold(req)
    sched.kv.free(req, cache=True)
    req.status, req.finish_reason = RequestStatus.for_reason(reason), reason
    del sched.requests[req.request_id]
    return req


def _block_events(running: list[Request], k: int, bs: int,
                  cache_on: bool) -> dict[int, list[tuple[int, bool]]]:
    """Step -> [(request index, allocates)] in running order: the steps whose decode needs a
    new block (then offers its full blocks to the cache) or completes a block (offers it).
    A request appears once per step (a step that does both allocates), and the requests are
    visited in order, so each step's list is in running order as it is built."""
    events: dict[int, list[tuple[int, bool]]] = {}
    for i, r in enumerate(running):
        c = r.num_computed_tokens
        first = len(r.block_ids) * bs - c  # end = c + j + 1 > held: the first step needing a block
        j = first
        while j < k:
            if j >= 0:
                events.setdefault(j, []).append((i, True))
            j += bs
        if cache_on:
            j = (-(c + 1)) % bs  # end = c + j + 1 a multiple of bs
            while j < k:
                if not (j >= first and (j - first) % bs == 0):  # (not one allocating already)
                    events.setdefault(j, []).append((i, False))
                j += bs
    return events
