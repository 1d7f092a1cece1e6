"""Arrival processes: when each request (or conversation) of an open-loop workload is sent."""

from __future__ import annotations

import math

import numpy as np


def arrival_times(n: int, rate: float, kind: str, rng: np.random.Generator,
                  burstiness: float = 1.0, ramp_up_s: float = 0.0) -> list[float]:
    """`n` send times in seconds from the start, non-decreasing.

    rate: mean arrivals per second once ramped up; inf sends everything at t=0.
    kind: constant (evenly spaced), poisson (exponential gaps), gamma (gaps drawn from a gamma
    distribution with shape `burstiness`: < 1 is burstier than Poisson, 1 is Poisson).
    ramp_up_s: the rate grows linearly from 0 to `rate` over this many seconds (a warm-up), by
    running the process in operational time Λ(t) = ∫ rate(t) dt and mapping it back.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    if not rate > 0:
        raise ValueError(f"rate must be > 0 (or inf), got {rate}")
    if ramp_up_s < 0:
        raise ValueError("ramp_up_s must be >= 0")
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
    if ramp_up_s > 0:
        times = _ramp(times, ramp_up_s)
    return [float(t) for t in times]


def _ramp(steady: np.ndarray, ramp_s: float) -> np.ndarray:
    """Map times of a constant-rate process to one whose rate ramps linearly over `ramp_s`.

    With a rate ramping from 0 to r over R seconds, the expected count by time t is
    r·t²/(2R) for t < R and r·(t − R/2) after, i.e. a constant-rate process's time u maps to
    t = sqrt(2·R·u) for u < R/2 and u + R/2 after."""
    half = ramp_s / 2
    return np.where(steady < half, np.sqrt(2 * ramp_s * steady), steady + half)
