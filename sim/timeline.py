"""The report over time of a cluster run (issue 16): per interval, the fleet's state at its
start (sampled by the autoscaler's control tick, sim/autoscale.py) and the latency of the
requests that arrived during it.

TTFT is per arrival interval, not per completion interval, so a replica's cold start shows
where it hurts: requests that arrive while the new replica boots queue on the old ones, and
their TTFT percentiles are higher than those of requests arriving once it is ready.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np

from clients.report import RequestResult


def timeline(samples: Sequence[dict[str, Any]], records: Sequence[RequestResult],
             ) -> list[dict[str, Any]]:
    """One row per sample: its keys, then `arrivals` (requests that arrived in [t, next t)),
    `ttft_p50_s` and `ttft_p99_s` of those that got a first token (None if none did)."""
    starts = [s["t"] for s in samples]
    ttfts: list[list[float]] = [[] for _ in samples]
    counts = [0] * len(samples)
    for r in records:
        i = bisect.bisect_right(starts, r.scheduled_s) - 1
        if i < 0:
            continue
        counts[i] += 1
        if r.error is None and r.token_times:
            ttfts[i].append(r.token_times[0] - r.scheduled_s)
    rows = []
    for s, n, xs in zip(samples, counts, ttfts, strict=True):
        p50 = p99 = None
        if xs:
            p50, p99 = (float(v) for v in np.percentile(xs, [50, 99]))
        rows.append({**s, "arrivals": n, "ttft_p50_s": p50, "ttft_p99_s": p99})
    return rows
