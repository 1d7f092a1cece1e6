"""Pipeline parallelism: how long until every sequence of a batch has advanced one step.

DESIGN.md: per-token latency is the sum of the stage times plus the hops between stages;
steady-state throughput is set by the slowest stage times the number of micro-batches in
flight. With ``S`` pipeline stages (Groq's hundreds of chips, Cerebras systems, GPU ``--pp``) a
batch of ``n`` sequences is split into ``m = min(n, S)`` micro-batches (sequences dealt round
robin). Each sequence waits for its own micro-batch to cross every stage (the latency of one
micro-batch), and the stages serve all ``m`` micro-batches one after another, so the cycle is
``max(latency, m × slowest stage)``. Without pipeline parallelism this is just ``step_cost``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from devices.cost import StepCost, step_cost
from devices.deployment import BatchShape
from devices.placed import Placement


@dataclass(frozen=True)
class CycleCost:
    """One engine step over a (possibly pipelined) deployment.

    ``seconds``: until every sequence of the batch has advanced; ``micro``: the cost of one
    micro-batch (bytes, FLOPs, bound, per-stage times); ``micro_batches``: how many were in
    flight; ``joules``/``dollars``: the whole cycle (each micro-batch's busy energy, plus the
    deployment's idle power and price over ``seconds``).
    """

    seconds: float
    micro: StepCost
    micro_batches: int
    joules: float
    dollars: float


def num_stages(placement: Placement) -> int:
    return sum(stage.repeat for stage in placement.plan.stages)


def micro_batch(batch: BatchShape, m: int) -> BatchShape:
    """The first (largest) of ``m`` micro-batches when sequences are dealt round robin."""
    seqs = [(True, p) for p in batch.prefill] + [(False, d) for d in batch.decode]
    first = seqs[::m]
    return replace(
        batch,
        prefill=tuple(p for is_prefill, p in first if is_prefill),  # type: ignore[misc]
        decode=tuple(d for is_prefill, d in first if not is_prefill),  # type: ignore[misc]
    )


def cycle_cost(placement: Placement, batch: BatchShape) -> CycleCost:
    plan = placement.plan
    stages = num_stages(placement)
    m = min(batch.num_seqs, stages) if stages > 1 else 1
    if m <= 1:
        cost = step_cost(placement, batch)
        return CycleCost(cost.seconds, cost, 1, cost.joules, cost.dollars)
    cost = step_cost(placement, micro_batch(batch, m))
    seconds = max(cost.seconds, m * cost.interval_s)
    busy = cost.joules - cost.seconds * plan.idle_w
    return CycleCost(seconds, cost, m, m * busy + seconds * plan.idle_w,
                     seconds * plan.usd_per_s)
