"""Streamed latency statistics: exact up to a bound, then a relative-error sketch.

Why it exists: a summary's percentiles need every value, and a million-request run has over a
hundred million inter-token gaps. `Quantiles` keeps the values themselves (float64, in NumPy
chunks) while there are at most `EXACT_MAX` of them — then its mean and percentiles are exactly
`np.mean`/`np.percentile` of the list, as `report.stats` always computed them — and past that
folds them into a log-bucketed sketch of bounded size (DDSketch, Masson, Rim & Lee, VLDB 2019:
"DDSketch: a fast and fully-mergeable quantile sketch with relative-error guarantees").

Error bound of the sketch (once more than `EXACT_MAX` values were added): bucket i holds the
values in (γ^(i-1), γ^i] with γ = (1 + α)/(1 − α), and reports 2γ^i/(γ + 1); so every reported
percentile is within relative error α = `ALPHA` (0.1 %) of the order statistic at the
percentile's rank (nearest rank, where `np.percentile` interpolates between neighbours), for
positive values; values <= 0 are counted as 0 exactly. The mean is the running sum's (float
rounding only). Memory: at most `EXACT_MAX` floats (4 Mi: a 10,000-request run stays exact),
then one counter per occupied bucket — 1 µs to 1 hour at α = 0.1 % is about 11,000 buckets,
whatever the count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

ALPHA = 0.001  # the sketch's relative accuracy (see the module docstring)
EXACT_MAX = 1 << 22  # values kept exactly (32 MiB of float64) before the sketch takes over
_GAMMA = (1 + ALPHA) / (1 - ALPHA)
_LOG_GAMMA = math.log(_GAMMA)
_CHUNK = 1 << 14  # values buffered in a Python list before they become a NumPy chunk


class Quantiles:
    """Mean and percentiles of a stream of floats (see the module docstring for the bound)."""

    def __init__(self) -> None:
        self._sealed = 0  # values in `_chunks` or the sketch
        self._total = 0.0  # their sum, once folded into the sketch
        self._pending: list[float] = []
        self._chunks: list[np.ndarray] = []
        self._buckets: dict[int, int] | None = None  # the sketch, once exact values ran out
        self._zeros = 0  # values <= 0 in the sketch
        # `extend_gaps`: the runs of times whose gaps are pending, where each run starts, and
        # how many gaps they hold
        self._runs: list[float] = []
        self._run_starts: list[int] = []
        self._gaps = 0

    @property
    def count(self) -> int:
        return self._sealed + len(self._pending) + self._gaps

    @property
    def exact(self) -> bool:
        """True while every value is kept (mean and percentiles are then exact)."""
        return self._buckets is None

    def add(self, value: float) -> None:
        self._pending.append(value)
        if len(self._pending) >= _CHUNK:
            self._seal()

    def extend(self, values: Sequence[float] | np.ndarray) -> None:
        if isinstance(values, np.ndarray):
            if len(values):
                self._seal()
                self._take(values.astype(np.float64, copy=False))
            return
        self._pending.extend(values)
        if len(self._pending) >= _CHUNK:
            self._seal()

    def extend_gaps(self, times: Sequence[float]) -> None:
        """Add the gaps between consecutive `times` (b - a: np.diff's doubles, in order).
        Why not `extend` of the gaps: a request's inter-token gaps are many short runs, and a
        list comprehension per run costs more than one `np.diff` over many runs at once, so
        the runs are kept as they come and differenced when sealed."""
        if len(times) > 1:
            self._run_starts.append(len(self._runs))
            self._runs.extend(times)
            self._gaps += len(times) - 1
            if self._gaps >= _CHUNK:
                self._seal()

    def _seal(self) -> None:
        if self._pending:
            chunk = np.asarray(self._pending, dtype=np.float64)
            self._pending = []
            self._take(chunk)
        if self._runs:
            gaps = np.diff(np.asarray(self._runs, dtype=np.float64))
            if len(self._run_starts) > 1:  # not the gap from one run's end to the next's start
                gaps = np.delete(gaps, np.asarray(self._run_starts[1:]) - 1)
            self._runs, self._run_starts, self._gaps = [], [], 0
            self._take(gaps)

    def _take(self, chunk: np.ndarray) -> None:
        self._sealed += len(chunk)
        if self._buckets is not None:
            self._fold(chunk)
            return
        self._chunks.append(chunk)
        if self._sealed > EXACT_MAX:  # from now on, the sketch
            self._buckets = {}
            chunks, self._chunks = self._chunks, []
            for c in chunks:
                self._fold(c)

    def _fold(self, chunk: np.ndarray) -> None:
        assert self._buckets is not None
        self._total += float(chunk.sum())
        positive = chunk[chunk > 0]
        self._zeros += len(chunk) - len(positive)
        keys, counts = np.unique(np.ceil(np.log(positive) / _LOG_GAMMA).astype(np.int64),
                                 return_counts=True)
        buckets = self._buckets
        for k, c in zip(keys.tolist(), counts.tolist(), strict=True):
            buckets[k] = buckets.get(k, 0) + c

    def values(self) -> np.ndarray:
        """Every value, in the order added (only while `exact`)."""
        if not self.exact:
            raise ValueError("the values were folded into a sketch")
        self._seal()
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0] if self._chunks else np.zeros(0)

    def stats(self, percentiles: Iterable[float]) -> dict[str, float]:
        """{"mean", "p50", ...}: `report.stats`' keys; zeros when there are no values."""
        percentiles = tuple(percentiles)
        if not self.count:
            return {"mean": 0.0, **{f"p{p}": 0.0 for p in percentiles}}
        self._seal()  # (which may hand the values to the sketch)
        if self.exact:
            arr = self.values()
            pct = np.percentile(arr, percentiles)
            return {"mean": float(arr.mean()),
                    **{f"p{p}": float(v) for p, v in zip(percentiles, pct, strict=True)}}
        return {"mean": self._total / self.count,
                **{f"p{p}": self._quantile(p / 100) for p in percentiles}}

    def _quantile(self, q: float) -> float:
        assert self._buckets is not None
        rank = round(q * (self.count - 1))  # 0-based nearest rank
        if rank < self._zeros:
            return 0.0
        seen = self._zeros
        for k in sorted(self._buckets):
            seen += self._buckets[k]
            if seen > rank:
                return 2 * _GAMMA ** k / (_GAMMA + 1)
        return 2 * _GAMMA ** max(self._buckets) / (_GAMMA + 1)
