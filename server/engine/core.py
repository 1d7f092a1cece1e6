"""EngineCore: one deployment's synchronous step — scheduler, device cost, mock model.

Both clocks drive the same core: the real-time `AsyncEngine` sleeps until each step's absolute
deadline, the virtual-time `run_virtual` just adds the step's seconds to its clock. The core
never sleeps, never awaits and never reads a clock, so it is easy to test and identical under
both.

One step (`step()`):
1. `scheduler.schedule()` picks the batch (running decodes and prefill chunks first, then
   waiting requests, within the token budget, sequence cap and KV blocks).
2. The batch becomes a device `BatchShape`; the compile strategy says whether it stalls (a new
   XLA bucket, a Groq recompile) and pads it to the compiled shape.
3. `cycle_cost` prices the padded batch on the placement (roofline per tier, overheads,
   links; over pipeline stages, micro-batches in flight — see `devices/pipeline.py`).
4. The mock model samples one token for each request whose prefill reached its last token
   (only tokens its grammar allows, for a constrained request). With jump-forward on, the
   tokens the grammar then forces are appended too: they are not decoded one step each but
   computed as a prefill-like extension of the next step (`num_computed_tokens` lags by
   1 + forced, so the scheduler schedules them as one chunk), and counted.
5. `scheduler.update()` appends the tokens, applies stop rules, finishes requests and frees
   their KV (into the prefix cache).

Speculative decoding (`speculative`): each decode verifies `drafts_per_step` drafts (a
chain's `num_speculative_tokens`, a tree's width), the device prices the draft passes and the
wider verification, and `speculate.verify` draws what is accepted (see there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from devices import BatchShape, CompileStrategy, Jitter, Placement, SpeculativeConfig, StepCost
from devices.compile import Stall
from devices.lora import NO_LORA, LoraCostModel, LoraStepCost
from devices.pipeline import CycleCost, cycle_cost
from server.engine.constraints import ConstraintCompiler
from server.engine.intake import QueueLimits
from server.engine.lora import LoraRegistry
from server.engine.mock_model import MockModel
from server.engine.request import Request
from server.engine.scheduler import Scheduler
from server.engine.scheduler_config import SchedulerOutput
from server.engine.spec_metrics import RequestSpecDecodeMetrics
from server.engine.speculate import verify


@dataclass(frozen=True)
class StepResult:
    """What one step did and what it cost.

    Why it exists: the clocks need only `seconds`; the output path needs the new tokens and
    the finished requests; metrics and reports need the cost breakdown. One plain object
    carries all three out of the core so nobody downstream touches scheduler state.
    """

    seconds: float  # emulated duration: compile stall + the (jittered) step cost
    stall_s: float
    stall_reason: str | None
    cost: StepCost
    output: SchedulerOutput
    new_tokens: dict[str, list[int]]
    finished: list[Request] = field(default_factory=list)
    micro_batches: int = 1  # pipeline micro-batches in flight; `cost` is one micro-batch's
    jump_forward: dict[str, int] = field(default_factory=dict)  # id -> forced tokens appended
    lora: LoraStepCost = NO_LORA  # what the step's LoRA adapters added (included in seconds)


@dataclass
class CoreStats:
    """Cumulative device-side counters (the scheduler keeps its own in `scheduler.stats`)."""

    busy_s: float = 0.0
    stall_s: float = 0.0
    compiles: int = 0
    joules: float = 0.0
    dollars: float = 0.0
    bytes: float = 0.0
    flops: float = 0.0
    steps: int = 0
    bound_s: dict[str, float] = field(default_factory=dict)  # bound -> seconds
    # speculative decoding, as vLLM's vllm:spec_decode_* counters (one draft = one request's
    # verification step; per-position counts how often draft position i was accepted)
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    # --- LoRA (issue 13) ---
    lora_s: float = 0.0  # of busy_s, the adapters' matmuls and loads
    lora_load_s: float = 0.0  # of lora_s, copying adapters onto the device
    lora_loads: int = 0


class EngineCore:
    def __init__(
        self,
        placement: Placement,
        scheduler: Scheduler,
        model: MockModel,
        compiler: CompileStrategy,
        jitter: Jitter,
        jump_forward: bool = False,
        constraints: ConstraintCompiler | None = None,
        speculative: SpeculativeConfig | None = None,
        lora: LoraRegistry | None = None,
    ) -> None:
        self.placement = placement
        self.scheduler = scheduler
        self.model = model
        self.compiler = compiler
        self.jitter = jitter
        self.jump_forward = jump_forward
        self.constraints = constraints  # compiles the requests' constraints (intake, virtual)
        self.queue_limits = QueueLimits()  # vLLM's queue limits (build_core sets them)
        self.speculative = speculative
        self.stats = CoreStats()
        self.startup_s = 0.0  # a cold start: seconds before it serves (build_core sets it)
        # the last macro window's last step (macro.py: how many steps a window may run)
        self.decode_step_s = 0.0
        # --- LoRA (issue 13) ---
        self.lora = lora if lora is not None and lora.config.enabled else None
        self.lora_cost = LoraCostModel(placement) if self.lora is not None else None
        if speculative is not None:
            self.stats.spec_num_accepted_tokens_per_pos = [0] * speculative.num_speculative_tokens
        # vLLM's --per-request-spec-decode-metrics (spec_metrics.LEVELS; build_core sets it)
        self.spec_metrics_level = "none"

    def add_request(self, req: Request) -> None:
        if self.spec_metrics_level != "none" and self.speculative is not None:
            req.spec_decode_metrics = RequestSpecDecodeMetrics.new(
                self.speculative.drafts_per_step)
        self.scheduler.add_request(req)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self, now: float | None = None) -> StepResult | None:
        """Run one step starting at `now` (emulated seconds: the clock the CPU tier's loads
        are timed on; default, the last given); None when nothing could be scheduled (no
        work, or all blocked: then `next_deadline` says when that may change by itself)."""
        output = self.scheduler.schedule(now)
        if output.is_empty:
            return None
        return self.run_step(output)

    def next_deadline(self) -> float | None:
        """When a step would schedule something new with no arrival: the end of the next load
        from the CPU tier (None: only an arrival, abort or transfer changes anything)."""
        return self.scheduler.next_load_end()

    def run_step(self, output: SchedulerOutput) -> StepResult:
        """The rest of `step` once the scheduler has decided `output` (not empty): price it,
        sample, update the scheduler, account. (A macro window that scheduled a step itself
        and found it not windowable finishes it here: `macro.advance`.)"""
        cycle, busy, stall = self.price(output)
        lora = self._lora(output) if self.lora is not None else NO_LORA
        busy += lora.seconds
        new_tokens, by_id, before, spec = self._sample(output)
        finished = self.scheduler.update(output, new_tokens)
        jumped = self._trim(new_tokens, by_id, before, spec)
        self._account(cycle, busy, stall.seconds)
        if lora is not NO_LORA:
            self.stats.lora_s += lora.seconds
            self.stats.lora_load_s += lora.load_s
            self.stats.flops += lora.flops
            self.stats.bytes += lora.bytes
        return StepResult(busy + stall.seconds, stall.seconds, stall.reason, cycle.micro,
                          output, new_tokens, finished, cycle.micro_batches, jumped, lora)

    def price(self, output: SchedulerOutput) -> tuple[CycleCost, float, Stall]:
        """The step's device cost, its (jittered) busy seconds and its compile stall: the
        batch as the device sees it, padded as its compiled program runs it."""
        batch = self._shape(output)
        stall = self.compiler.before_step(batch)
        cycle = cycle_cost(self.placement, self.compiler.padded(batch))
        return cycle, self.jitter.apply(cycle.seconds), stall

    def _lora(self, output: SchedulerOutput) -> LoraStepCost:
        """The adapters' share of the step: their tokens' low-rank matmuls, and the copy of
        any adapter not yet on the device (see devices/lora.py)."""
        assert self.lora is not None and self.lora_cost is not None
        tokens: dict[int, int] = {}
        requests = self.scheduler.requests
        for s in output.scheduled:
            req = requests.get(s.request_id)
            if req is not None and req.lora_id:
                tokens[req.lora_id] = tokens.get(req.lora_id, 0) + s.num_new_tokens + \
                    s.num_draft_tokens
        if not tokens:
            return NO_LORA
        loaded = self.lora.activate(tokens)
        self.stats.lora_loads += len(loaded)
        by_id = self.lora.by_id
        return self.lora_cost.step(
            ((by_id[i].rank, n) for i, n in tokens.items() if i in by_id),
            (a.rank for a in loaded))

    def _shape(self, output: SchedulerOutput) -> BatchShape:
        """The step as the device sees it; a decode verifying drafts is priced with them (a
        decode left without drafts by the budget is priced as a one-token chunk)."""
        if self.speculative is None:
            return BatchShape(prefill=tuple(output.prefill_segments),
                              decode=tuple(output.decode_context_lengths))
        dec = [s for s in output.scheduled if not s.is_prefill]
        plain = tuple((1, s.start_position) for s in dec if not s.num_draft_tokens)
        return BatchShape.speculating(
            tuple(output.prefill_segments) + plain,
            tuple(s.start_position + 1 for s in dec if s.num_draft_tokens), self.speculative)

    def _sample(self, output: SchedulerOutput):
        """The model's tokens, each followed by its grammar's forced run under jump-forward
        (or the accepted drafts under speculative decoding); the requests and their lengths
        before `update` (to see what it appended)."""
        requests = self.scheduler.requests
        new_tokens = self.model.next_tokens(output, requests)
        if not (self.speculative or self.jump_forward):  # one token each: nothing to trim
            return new_tokens, {}, {}, set()
        by_id = {rid: requests[rid] for rid in new_tokens}
        before = {rid: req.num_tokens for rid, req in by_id.items()}
        spec = verify(self, output, new_tokens, by_id) if self.speculative else set()
        if self.jump_forward:
            for rid, tokens in new_tokens.items():
                if by_id[rid].constraint is not None:
                    tokens.extend(self._forced_run(by_id[rid], tokens[-1]))
        return new_tokens, by_id, before, spec

    def _forced_run(self, req: Request, sampled: int) -> list[int]:
        """The tokens the grammar forces after `sampled`, within max_tokens and the context."""
        sp = req.sampling_params
        if sampled == self.scheduler.eos_token_id or sampled in sp.stop_token_ids:
            return []
        room = min(sp.max_tokens - req.num_output_tokens,
                   self.scheduler.config.max_model_len - req.num_tokens) - 1
        return req.constraint.forced_run(room) if room > 0 else []

    def _trim(self, new_tokens: dict[str, list[int]], by_id: dict[str, Request],
              before: dict[str, int], spec: set[str]) -> dict[str, int]:
        """Keep only the tokens `update` appended (a stop ends a run early); count the
        jump-forward tokens (all but the sampled first; not accepted drafts of the requests
        in `spec`) on the request and the scheduler."""
        jumped: dict[str, int] = {}
        for rid, n in before.items():
            tokens = new_tokens[rid]
            del tokens[max(by_id[rid].num_tokens - n, 0):]
            if len(tokens) > 1 and rid not in spec:
                jumped[rid] = len(tokens) - 1
                by_id[rid].num_jump_forward_tokens += len(tokens) - 1
                self.scheduler.stats.num_jump_forward_tokens += len(tokens) - 1
        return jumped

    def _account(self, cycle: CycleCost, busy: float, stall: float) -> None:
        s = self.stats
        s.steps += 1
        s.busy_s += busy
        s.stall_s += stall
        s.compiles = self.compiler.compiles
        scale = busy / cycle.seconds if cycle.seconds else 1.0
        s.joules += cycle.joules * scale + self.idle_watts * stall
        s.dollars += cycle.dollars * scale + self.dollars_per_s * stall
        s.bytes += cycle.micro.bytes * cycle.micro_batches
        s.flops += cycle.micro.flops * cycle.micro_batches
        s.bound_s[cycle.micro.bound] = s.bound_s.get(cycle.micro.bound, 0.0) + busy

    @property
    def idle_watts(self) -> float:
        """The whole deployment's idle power (what an idle or stalled step draws); one
        data-parallel rank's share of its group's (`Plan.ranks`)."""
        return self.placement.plan.rank_idle_w

    @property
    def dollars_per_s(self) -> float:
        return self.placement.plan.rank_usd_per_s

    def account_idle(self, seconds: float) -> None:
        """Charge `seconds` of idle time (no step running) to energy and money."""
        self.stats.joules += self.idle_watts * seconds
        self.stats.dollars += self.dollars_per_s * seconds
