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
3. `step_cost` prices the padded batch on the placement (roofline per tier, overheads, links).
4. The mock model samples one token for each request whose prefill reached its last token.
5. `scheduler.update()` appends the tokens, applies stop rules, finishes requests and frees
   their KV (into the prefix cache).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from devices import BatchShape, CompileStrategy, Jitter, Placement, StepCost, step_cost
from server.engine.mock_model import MockModel
from server.engine.request import Request
from server.engine.scheduler import Scheduler
from server.engine.scheduler_config import SchedulerOutput


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


class EngineCore:
    def __init__(
        self,
        placement: Placement,
        scheduler: Scheduler,
        model: MockModel,
        compiler: CompileStrategy,
        jitter: Jitter,
    ) -> None:
        self.placement = placement
        self.scheduler = scheduler
        self.model = model
        self.compiler = compiler
        self.jitter = jitter
        self.stats = CoreStats()

    def add_request(self, req: Request) -> None:
        self.scheduler.add_request(req)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> StepResult | None:
        """Run one step; None when nothing could be scheduled (no work, or all blocked)."""
        output = self.scheduler.schedule()
        if output.is_empty:
            return None
        batch = BatchShape(
            prefill=tuple(output.prefill_segments), decode=tuple(output.decode_context_lengths)
        )
        stall = self.compiler.before_step(batch)
        cost = step_cost(self.placement, self.compiler.padded(batch))
        busy = self.jitter.apply(cost.seconds)
        new_tokens = self.model.next_tokens(output, self.scheduler.requests)
        finished = self.scheduler.update(output, new_tokens)
        self._account(cost, busy, stall.seconds)
        return StepResult(busy + stall.seconds, stall.seconds, stall.reason, cost, output,
                          new_tokens, finished)

    def _account(self, cost: StepCost, busy: float, stall: float) -> None:
        s = self.stats
        s.steps += 1
        s.busy_s += busy
        s.stall_s += stall
        s.compiles = self.compiler.compiles
        scale = busy / cost.seconds if cost.seconds else 1.0
        s.joules += cost.joules * scale + self.idle_watts * stall
        s.dollars += cost.dollars * scale + self.dollars_per_s * stall
        s.bytes += cost.bytes
        s.flops += cost.flops
        s.bound_s[cost.bound] = s.bound_s.get(cost.bound, 0.0) + busy

    @property
    def idle_watts(self) -> float:
        """The whole deployment's idle power (what an idle or stalled step draws)."""
        return self.placement.plan.idle_w

    @property
    def dollars_per_s(self) -> float:
        return self.placement.plan.usd_per_s

    def account_idle(self, seconds: float) -> None:
        """Charge `seconds` of idle time (no step running) to energy and money."""
        self.stats.joules += self.idle_watts * seconds
        self.stats.dollars += self.dollars_per_s * seconds
