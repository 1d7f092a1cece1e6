"""A macro window's head: the admission step a window of decode steps may start with.

Why it exists: in a virtual run every arrival ends one window and is admitted by the next step
— a step that prefills the new request(s) while every running request decodes. Run as a single
step, it pays the sampling and the update of every decode in Python, and the window after it
starts from scratch. A window may instead begin with it: the scheduler's `schedule()` decides
the step for real (the very admissions, block allocations and cache insertions, in its order),
`cycle_cost` prices it as `EngineCore.step` does, and its tokens — the decodes' next ones and
each new request's first — come from the window's draws like every later step's (a draw is a
pure function of the context). From then on a new request whose whole prompt was computed is
a decode like the others: with its computed count set to its length minus one, the window's
closed forms (its context, its block boundaries, its end) are the ones a decode of its last
prompt token has, and the window ends it or carries it on as single steps would.

Contract: `admits_next(core)` says whether the next step is such an admission over a batch of
plain decodes (`macro.eligible` but for the waiting request(s)). `head_step(core)` then runs
`schedule()` and either returns the `Head` (the step priced and accounted as
`EngineCore.run_step` would; its prefill tokens counted; each new request's computed count set
as above, which the window then carries to its real value) or, when the step is not one a
window can continue (a prefill chunk, a preemption, a request a window cannot draw for, an
admission still possible next step), finishes it as `EngineCore.run_step` and returns that
`StepResult`.
"""

from __future__ import annotations

from dataclasses import dataclass

from devices.cost_window import closed_form
from server.engine.core import EngineCore, StepResult
from server.engine.mock_model import LAG
from server.engine.policy import WaitingQueue
from server.engine.request import Request
from server.engine.scheduler_config import SchedulerOutput


@dataclass
class Head:
    """The admission step a window starts with: what was scheduled (the runner reads the new
    requests' first-scheduled time from it) and its seconds."""

    output: SchedulerOutput
    seconds: float


def plain_core(core: EngineCore) -> bool:
    """No feature a window cannot reproduce: speculation, LoRA, compiles, jitter, a cost
    without a closed form, contiguous KV, loads from the CPU tier in flight."""
    sched = core.scheduler
    return (core.speculative is None and core.lora is None and core.compiler.kind == "none"
            and not sched.num_loading
            and not core.jitter.sigma and closed_form(core.placement) and not sched.kv.contiguous
            and not sched.config.num_speculative_tokens)


def plain_decodes(core: EngineCore, running: list[Request]) -> bool:
    """Every request of `running` is a plain decode a window can draw for and close."""
    sched = core.scheduler
    bs, cache_on = sched.kv.block_size, sched.cache.enabled
    for r in running:
        n = len(r.token_ids)
        if (r.constraint is not None or r.sampling_params.stop_token_ids or n <= LAG
                or r.num_computed_tokens != n - 1 or n - 1 < r.num_prompt_tokens
                or (cache_on and r._tree_len < (n - 1) // bs * bs)):
            return False
    return True


def no_admission_next(core: EngineCore) -> bool:
    """No waiting request can be admitted at the next step (every seat taken), no pull can
    start without a seat (vLLM 0.34.0's max_num_inflight_kv_loads), and the queue is not
    reordered by its policy nor by cache-aware admission (each step's reorder breaks ties by
    the last one's order, so skipping one could change a later admission)."""
    sched = core.scheduler
    if not sched.waiting:
        return True
    cfg = sched.config
    return (len(sched.running) >= cfg.max_num_seqs
            and type(sched.waiting).prepare is WaitingQueue.prepare
            and not (cfg.cache_aware_admission_window and len(sched.waiting) > 1)
            and not (cfg.max_num_inflight_kv_loads is not None and sched.pulls is not None
                     and sched.pulls.expected))


def admits_next(core: EngineCore) -> bool:
    sched = core.scheduler
    running = sched.running
    return (bool(running) and bool(sched.waiting) and len(running) < sched.config.max_num_seqs
            and len(running) <= sched.config.max_num_batched_tokens and plain_core(core)
            and plain_decodes(core, running))


def head_step(core: EngineCore, t: float) -> Head | StepResult:
    """Schedule the admission step starting at `t` (see the module's contract)."""
    sched = core.scheduler
    before = len(sched.running)
    output = sched.schedule(t)  # never empty: every running request decodes
    running = sched.running
    new = running[before:]
    if (output.preempted_request_ids or sched.num_loading or len(output.scheduled) != len(running)
            or len(running) > sched.config.max_num_batched_tokens or not no_admission_next(core)
            or any(not s.samples_token or s.num_draft_tokens for s in output.scheduled)
            or any(r.constraint is not None or r.sampling_params.stop_token_ids
                   or len(r.token_ids) <= LAG for r in new)):
        return core.run_step(output)
    cycle, busy, stall = core.price(output)  # as EngineCore.run_step prices it
    core._account(cycle, busy, stall.seconds)
    stats = sched.stats
    for s in output.scheduled:
        if s.is_prefill:
            stats.num_prefill_tokens += s.num_new_tokens
    for r in new:  # a decode of its last prompt token, from the window's point of view
        r.num_computed_tokens = len(r.token_ids) - 1
    return Head(output, busy + stall.seconds)
