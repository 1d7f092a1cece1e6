"""The Kubernetes HPA's arithmetic (kubernetes.io, "Horizontal Pod Autoscaling", Algorithm
details; KEP-853 for the stabilisation windows), as `sim.autoscale.Autoscaler` applies it each
sync: the metric read from a replica, the replica calculator's recommendation with missing
metrics, and the stabilisation of recommendations over time. Pure functions: the controller
owns the state."""

from __future__ import annotations

import math
from collections.abc import Sequence

from server.engine.core import EngineCore
from sim.routers import kv_usage


def stabilised(history: Sequence[tuple[float, int]], t: float, rec: int, current: int,
               up_window_s: float, down_window_s: float) -> int:
    """The HPA's stabilisation (KEP-853): scale up only to the lowest recommendation of the
    scale-up window, down only to the highest of the scale-down window; `history` holds the
    earlier (time, recommendation) pairs, `rec` is this pass's."""
    up = min([r for at, r in history if at > t - up_window_s] + [rec])
    down = max([r for at, r in history if at > t - down_window_s] + [rec])
    return min(max(current, up), down)


def metric_of(core: EngineCore, metric: str) -> float:
    """What the autoscaler scrapes from one replica."""
    sched = core.scheduler
    if metric == "waiting":
        return float(sched.num_waiting)
    if metric == "running":
        return float(sched.num_running)
    return kv_usage(core)


def hpa_recommendation(current: int, ready_values: Sequence[float], booting: int,
                       target: float, tolerance: float) -> int:
    """The replica count the HPA's replica calculator gives for a per-pod average target:
    `ready_values` from the pods that report, `booting` pods without metrics yet."""
    if not ready_values:
        return current
    ratio = sum(ready_values) / len(ready_values) / target
    if booting == 0:
        if abs(ratio - 1.0) <= tolerance:
            return current
        return math.ceil(ratio * len(ready_values))
    if abs(ratio - 1.0) <= tolerance:
        return current
    fill = 0.0 if ratio > 1.0 else target  # missing metrics: 0 up, the target down
    total = len(ready_values) + booting
    new_ratio = (sum(ready_values) + fill * booting) / (target * total)
    if abs(new_ratio - 1.0) <= tolerance or (new_ratio > 1.0) != (ratio > 1.0):
        return current
    return math.ceil(new_ratio * total)
