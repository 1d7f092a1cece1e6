"""Macro-stepping: many decode-only engine steps advanced together, identical to one by one.

Why it exists: between the events that change a batch (an arrival, a finish, a preemption, a
prefill chunk, a constrained or speculative request) every step of a virtual run is the same
decode batch one token further on. Single-stepping pays the scheduler's loop, the sampling and
the update in Python for each of those steps; `advance` draws the window's tokens for the
whole batch at once (`mock_model.lookahead`, the very draws `next_token` makes) and walks the
steps with only what differs between them: the device cost of the batch at its new context
lengths (the same `cycle_cost`, compile strategy and jitter, so times and counters are the
same floats), and the KV block events (a block completed and offered to the prefix cache, a
new block allocated) at the step and in the order the scheduler makes them.

Contract: `advance` either returns None having changed nothing (the batch is not a plain
decode batch, or no two steps are free of events), or runs K >= 1 steps exactly as K calls of
`EngineCore.step` would — same tokens, same scheduler, pool, cache and core state — none of
which finishes a request, and stops after the first step ending at or after `until` (the next
arrival). The finishing step itself, and everything else, is left to `EngineCore.step`.
"""

from __future__ import annotations

from dataclasses import dataclass

from devices import BatchShape
from devices.pipeline import cycle_cost
from server.engine.core import EngineCore
from server.engine.mock_model import lookahead
from server.engine.policy import WaitingQueue

MAX_WINDOW = 4096  # steps of one window at most


@dataclass
class MacroSteps:
    """The K steps `advance` ran: each step's seconds and KV usage after it (the virtual
    runner accumulates them as it would K step results), and the tokens each request got."""

    seconds: list[float]
    usage: list[float]
    request_ids: list[str]  # each got one token per step


def eligible(core: EngineCore) -> bool:
    """Whether the next step is a plain decode batch with no admission and no event the
    window cannot reproduce (every step of the window is then one, until an event)."""
    sched, cfg = core.scheduler, core.scheduler.config
    running = sched.running
    if (not running or core.speculative is not None or core.lora is not None
            or sched.kv.contiguous or cfg.num_speculative_tokens
            or len(running) > cfg.max_num_batched_tokens):
        return False
    # a waiting queue: admissions must be impossible (every seat taken) and it not reordered
    if sched.waiting and (len(running) < cfg.max_num_seqs
                          or type(sched.waiting).prepare is not WaitingQueue.prepare):
        return False
    bs, cache_on = sched.kv.block_size, sched.cache.enabled
    for r in running:
        n = len(r.token_ids)
        if (r.constraint is not None or r.sampling_params.stop_token_ids
                or r.num_computed_tokens != n - 1 or n - 1 < r.num_prompt_tokens
                or r._hash_len != n - 1 or (cache_on and r._tree_len < (n - 1) // bs * bs)):
            return False
    return True


class Lookahead:
    """Each running decode's next tokens, drawn ahead in chunks and kept across windows.

    A request's future is a pure function of its tokens (the mock model's contract), so a
    buffer stays valid until the request finishes (`forget`): preemption and recompute give
    the same tokens. Kept per request in flight only, so memory does not grow with the run."""

    CHUNK = 64

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.ahead: dict[str, tuple[int, list[int], list[int]]] = {}  # id -> (len, toks, hashes)

    def forget(self, request_id: str) -> None:
        self.ahead.pop(request_id, None)

    def window(self, running: list, k: int) -> list[tuple[list[int], list[int], int]]:
        """(tokens, hashes, offset) per request covering its next draws; at least min(k, CHUNK)
        of them unless an EOS comes first."""
        ahead, eos = self.ahead, self.core.model.eos_token_id
        want = min(k, self.CHUNK // 4)
        stale = []
        for r in running:
            buf = ahead.get(r.request_id)
            n = len(r.token_ids)
            if buf is None or buf[0] > n or (buf[0] + len(buf[1]) - n < want
                                             and eos not in buf[1][n - buf[0]:]):
                stale.append(r)
        if stale:  # top the others up too: one vectorised draw serves the whole batch
            ids = {r.request_id for r in stale}
            for r in running:
                buf = ahead[r.request_id] if r.request_id not in ids else None
                if buf is not None and buf[0] + len(buf[1]) - len(r.token_ids) < self.CHUNK // 2:
                    stale.append(r)
            tokens, hashes = lookahead(self.core.model, stale, self.CHUNK)
            for r, tk, hs in zip(stale, tokens.tolist(), hashes.tolist(), strict=True):
                ahead[r.request_id] = (len(r.token_ids), tk, hs)
        out = []
        for r in running:
            start, tk, hs = ahead[r.request_id]
            out.append((tk, hs, len(r.token_ids) - start))
        return out


def advance(core: EngineCore, t: float, until: float | None,
            ahead: Lookahead) -> MacroSteps | None:
    """Run decode steps from time `t` (see the module's contract)."""
    if not eligible(core):
        return None
    sched = core.scheduler
    cfg, kv, pool = sched.config, sched.kv, sched.pool
    running = list(sched.running)
    bs = kv.block_size
    # steps before the first that ends a request by length (0-based index of that step)
    k = min(MAX_WINDOW, *(
        min(r.sampling_params.max_tokens - r.num_output_tokens,
            cfg.max_model_len - r.num_tokens) - 1 for r in running))
    if k < 2:
        return None
    bufs = ahead.window(running, k)
    eos = core.model.eos_token_id
    for tk, _, off in bufs:
        end = min(len(tk), off + k)
        try:
            k = tk.index(eos, off, end) - off  # the step that draws EOS finishes a request
        except ValueError:
            k = end - off
    if k < 2:
        return None
    starts = [r.num_computed_tokens for r in running]
    events = _block_events(running, starts, k, bs, kv.cache.enabled)
    for r, (tk, _, off) in zip(running, bufs, strict=True):
        r.token_ids.extend(tk[off:off + k])
    seconds: list[float] = []
    usage: list[float] = []
    u = (pool.num_used - sched.cache.evictable_blocks) / cfg.num_blocks
    stats, compiler, placement, jitter = sched.stats, core.compiler, core.placement, core.jitter
    done = 0
    now = t
    for j in range(k):
        step_events = events.get(j)
        if step_events:
            if sum(alloc for _, alloc in step_events) > pool.num_free:
                break  # an allocation could evict or preempt: the scheduler decides that
            for i, alloc in step_events:
                req = running[i]
                end = starts[i] + j + 1
                req.num_computed_tokens = end - 1
                if alloc and not kv.allocate_slots(req, 1):  # cannot fail: checked above
                    raise AssertionError("macro step: a checked allocation failed")
                kv.cache_blocks(req, end)
            u = (pool.num_used - sched.cache.evictable_blocks) / cfg.num_blocks
        stats.num_lora_deferred = 0
        stats.num_steps += 1
        batch = BatchShape(prefill=(), decode=tuple(c + j + 1 for c in starts))
        stall = compiler.before_step(batch)
        cycle = cycle_cost(placement, compiler.padded(batch))
        busy = jitter.apply(cycle.seconds)
        core._account(cycle, busy, stall.seconds)
        step_s = busy + stall.seconds
        seconds.append(step_s)
        usage.append(u)
        done += 1
        now += step_s
        if until is not None and now >= until:
            break
    _truncate(running, starts, done)
    if not done:
        return None
    stats.num_generation_tokens += len(running) * done
    for r, c, (_, hs, off) in zip(running, starts, bufs, strict=True):
        r._hash_value, r._hash_len = hs[off + done - 1], c + done
    return MacroSteps(seconds, usage, [r.request_id for r in running])


def _truncate(running, starts: list[int], done: int) -> None:
    """Keep the first `done` tokens of the window on each request, computed up to them."""
    for r, c in zip(running, starts, strict=True):
        del r.token_ids[c + 1 + done:]
        r.num_computed_tokens = c + done


def _block_events(running, starts: list[int], k: int, bs: int,
                  cache_on: bool) -> dict[int, list[tuple[int, bool]]]:
    """Step -> [(request index, allocates)] in running order: the steps whose decode needs a
    new block (then offers its full blocks to the cache) or completes a block (offers it)."""
    events: dict[int, list[tuple[int, bool]]] = {}
    for i, (r, c) in enumerate(zip(running, starts, strict=True)):
        held = len(r.block_ids) * bs
        steps: dict[int, bool] = {}
        j = held - c  # end = c + j + 1 > held: the first step needing a block
        while j < k:
            if j >= 0:
                steps[j] = True
            j += bs
        if cache_on:
            j = (-(c + 1)) % bs  # end = c + j + 1 a multiple of bs
            while j < k:
                steps.setdefault(j, False)
                j += bs
        for j in steps:
            events.setdefault(j, []).append((i, steps[j]))
    for lst in events.values():
        lst.sort()
    return events
