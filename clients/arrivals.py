"""Arrival processes: when each request (or conversation) of an open-loop workload is sent."""

from __future__ import annotations

import math

import numpy as np


def arrival_times(n: int, rate: float, kind: str, rng: np.random.Generator,
                  burstiness: float = 1.0) -> list[float]:
    """`n` send times in seconds from the start, non-decreasing.

    rate: mean arrivals per second; inf sends everything at t=0.
    kind: constant (evenly spaced), poisson (exponential gaps), gamma (gaps drawn from a gamma
    distribution with shape `burstiness`: < 1 is burstier than Poisson, 1 is Poisson).
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    if not rate > 0:
        raise ValueError(f"rate must be > 0 (or inf), got {rate}")
    if math.isinf(rate):
        return [0.0] * n
    if kind == "constant":
        gaps = np.full(n, 1.0 / rate)
    elif kind == "poisson":
        gaps = rng.exponential(1.0 / rate, size=n)
    elif kind == "gamma":
        if burstiness <= 0:
            raise ValueError("burstiness must be > 0")
        gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    else:
        raise ValueError(f"unknown arrival process {kind!r}; constant, poisson or gamma")
    times = np.cumsum(gaps) - gaps[0] if n else gaps  # the first request goes at t=0
    return [float(t) for t in times]
