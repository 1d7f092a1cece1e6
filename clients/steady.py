"""Steady-state throughput of one open-loop run: does achieved throughput follow the offered
rate?

A run's `requests_per_s` divides completions by the whole run, drain included, so a short
run at a light load looks "saturated" (a 100-request burst at 256 req/s spends most of its
time draining) and a long run past saturation looks healthy for as long as its queue has
room to grow. This module measures instead over a *window*: from the end of a warm-up (the
first requests' service time, when the pipeline is still filling) to the last arrival. In that
window a target that keeps up completes requests at the rate they arrive; a saturated one
completes them at its capacity while its queue, and so every request's TTFT, grows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clients.report import RequestResult, meets

SATURATION_RATIO = 0.9  # saturated when achieved < 90% of the offered rate in the window,
NOISE_SIGMAS = 3.0  # by more than this many standard deviations of the arrivals' count
QUEUE_GROWTH = 2.0  # ... or when the last quarter's median TTFT is 2x the first quarter's
WINDOW_SERVICE_TIMES = 10.0  # the window must span this many median service times


@dataclass(frozen=True)
class Steady:
    """Rates over the steady-state window [start_s, end_s] of one run."""

    start_s: float
    end_s: float
    offered_rate: float  # arrivals in the window / its length (the realised offered rate)
    achieved_rate: float  # completions in the window / its length
    goodput_rate: float  # completions in the window meeting the SLO / its length
    ttft_growth: float  # median TTFT of the window's last quarter / its first quarter's
    service_s: float  # median time from first token to last (decode, no queueing)

    @property
    def window_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def ratio(self) -> float:
        """achieved / offered: 1 while the target keeps up."""
        return self.achieved_rate / self.offered_rate if self.offered_rate else 0.0

    @property
    def goodput_fraction(self) -> float:
        """goodput / achieved: the share of the window's completions within the SLO. Against
        the achieved rate, not the offered one: a target that keeps up serves what arrives
        (whether it keeps up is `saturated`'s question), and the two counts differ by the
        requests in flight at the window's edges — ±20% for a short run at a light load,
        which is not the SLO being missed (nor met 106%)."""
        return self.goodput_rate / self.achieved_rate if self.achieved_rate else 0.0

    @property
    def falls_behind(self) -> bool:
        """Achieved below SATURATION_RATIO of offered, by more than the noise of a Poisson
        count of this many arrivals (sd = its square root): a short run at a light load —
        a few dozen arrivals in the window — completes ±20% of them by chance (requests in
        flight at the window's edges), which is not a target falling behind."""
        arrived = self.offered_rate * self.window_s
        shortfall = (self.offered_rate - self.achieved_rate) * self.window_s
        return self.ratio < SATURATION_RATIO and shortfall > NOISE_SIGMAS * arrived ** 0.5

    @property
    def saturated(self) -> bool:
        return self.falls_behind or self.ttft_growth > QUEUE_GROWTH

    @property
    def long_enough(self) -> bool:
        """The window spans WINDOW_SERVICE_TIMES service times: requests in flight at its
        edges no longer move the rates (a doubled run gives the same answer)."""
        return self.window_s >= WINDOW_SERVICE_TIMES * self.service_s

    def as_dict(self) -> dict[str, float | bool]:
        return {"window_s": self.window_s, "offered_rate": self.offered_rate,
                "achieved_rate": self.achieved_rate, "achieved_over_offered": self.ratio,
                "goodput_rate": self.goodput_rate, "goodput_fraction": self.goodput_fraction,
                "ttft_growth": self.ttft_growth, "service_s": self.service_s,
                "saturated": self.saturated, "long_enough": self.long_enough}


def steady_state(results: list[RequestResult], slo: dict[str, float]) -> Steady:
    """The steady-state window of an open-loop run and its rates (see the module doc)."""
    if not results:
        return Steady(0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0)
    arrivals = np.sort([r.scheduled_s for r in results])
    t0, t1 = float(arrivals[0]), float(arrivals[-1])
    services = [r.token_times[-1] - r.token_times[0] for r in results if r.ok and r.token_times]
    service = float(np.median(services)) if services else 0.0
    first = sorted(results, key=lambda r: r.scheduled_s)[: max(1, len(results) // 20)]
    warmup = max(0.1 * (t1 - t0), max(r.e2e for r in first if r.ok) if any(
        r.ok for r in first) else 0.0)
    start = min(t0 + warmup, t1)
    length = max(t1 - start, 1e-12)
    offered = int(np.count_nonzero((arrivals >= start) & (arrivals <= t1)))
    done = [r for r in results if r.ok and start <= r.end_s <= t1]
    good = sum(meets(r, slo) for r in done) if slo else len(done)
    return Steady(start, t1, offered / length, len(done) / length, good / length,
                  _ttft_growth(results, start), service)


def _ttft_growth(results: list[RequestResult], start: float) -> float:
    """Median TTFT of the requests arriving in the window's last quarter over its first."""
    inside = sorted((r for r in results if r.ok and r.ttft is not None and r.scheduled_s >= start),
                    key=lambda r: r.scheduled_s)
    q = len(inside) // 4
    if q < 5:
        return 1.0
    head = float(np.median([r.ttft for r in inside[:q]]))
    tail = float(np.median([r.ttft for r in inside[-q:]]))
    return tail / head if head > 0 else 1.0
