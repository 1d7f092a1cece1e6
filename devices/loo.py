"""Predicting calibration points, and leave-one-out over the groups that can afford it.

A group (engine, chip class) with as many points as free factors reproduces its points by
construction; only a group with MORE points than the factors its own points set has a
residual, and only there does leaving a point out and predicting it from the rest say
something about the physics. ``leave_one_out`` does exactly that for every such group.
"""

from __future__ import annotations

from dataclasses import dataclass

from devices.calibration import POINTS, Group, Point, fit, fitted_factors, without
from devices.estimate import estimate
from devices.factors import FACTOR_NAMES
from devices.placed import FactorTable
from devices.placement import place

KEY = {"decode": "decode_tokens_per_s", "prefill": "prefill_tokens_per_s",
       "throughput": "end_to_end_tokens_per_s"}


def predict(p: Point, table: FactorTable | None = None) -> float:
    """``estimate``'s figure for a calibration point (throughput: at the point's batch,
    capped by KV capacity, as "max throughput" runs as many sequences as fit)."""
    table = fitted_factors() if table is None else table
    batch = p.batch
    if p.kind == "throughput":
        batch = max(1, min(batch, place(p.spec, table).max_concurrency(p.prompt + p.output)))
    result = estimate(p.spec, p.prompt, p.output, batch, table)
    if not result["fits"]:
        raise ValueError(f"{p.id}: {result['error']}")
    return result[KEY[p.kind]]


def free_factors(group: Group, points: tuple[Point, ...] = POINTS) -> int:
    """Factors of ``group`` its own points set (the rest are borrowed or assumed)."""
    f = fit(points)[group]
    mine = {p.id for p in points if p.group == group and p.fit}
    return sum(1 for name in FACTOR_NAMES
               if f.provenance_of(name).kind == "fitted"
               and set(f.provenance_of(name).points) <= mine)


def groups(points: tuple[Point, ...] = POINTS) -> dict[Group, tuple[int, int]]:
    """group -> (fitted points, free factors), for every group with a point."""
    out: dict[Group, tuple[int, int]] = {}
    for g in sorted({p.group for p in points if p.fit}):
        n = sum(1 for p in points if p.fit and p.group == g)
        out[g] = (n, free_factors(g, points))
    return out


@dataclass(frozen=True)
class LooResult:
    point: str
    group: Group
    predicted: float
    published: float

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1


def leave_one_out(points: tuple[Point, ...] = POINTS) -> list[LooResult]:
    """For every group with more points than free factors, refit without each of its points
    in turn and predict it."""
    out = []
    for g, (n, free) in groups(points).items():
        if n <= free:
            continue
        for p in (q for q in points if q.fit and q.group == g):
            out.append(LooResult(p.id, g, predict(p, fit(without(p.id, points))), p.value))
    return out
