"""Where each metric lives in a stats array: a declarative list of metric definitions and the
offsets they get.

A counter or gauge takes one slot per value of its (optional) extra label; a histogram takes,
per label value, one slot per bucket (non-cumulative counts, the last one +Inf) and one for
the sum. Writers and readers build the same `Layout` from the same definitions, so the array
needs no self-description.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MetricDef:
    name: str  # the Prometheus family name (counters without `_total`)
    kind: str  # "counter" | "gauge" | "histogram"
    help: str
    buckets: tuple[float, ...] = ()  # histogram upper bounds, +Inf implied
    label: str | None = None  # one extra label (finished_reason, tier, bound, reason, ...)
    values: tuple[str, ...] = ()  # the values of that label, one slot (or histogram) each
    per_engine: bool = True  # False: vLLM exports it without the `engine` label (summed)

    @property
    def width(self) -> int:
        per = len(self.buckets) + 2 if self.kind == "histogram" else 1
        return per * max(1, len(self.values))


class Layout:
    def __init__(self, defs: Sequence[MetricDef]) -> None:
        self.defs = {d.name: d for d in defs}
        self.offset: dict[str, int] = {}
        at = 0
        for d in defs:
            self.offset[d.name] = at
            at += d.width
        self.size = at

    def slot(self, name: str, value: str | None = None) -> int:
        """The slot of a counter or gauge (for one value of its extra label)."""
        d = self.defs[name]
        return self.offset[name] + (d.values.index(value) if value is not None else 0)

    def hist(self, name: str, value: str | None = None) -> tuple[int, int]:
        """(first bucket slot, sum slot) of a histogram (for one value of its extra label)."""
        d = self.defs[name]
        per = len(d.buckets) + 2
        base = self.offset[name] + per * (d.values.index(value) if value is not None else 0)
        return base, base + per - 1


class HistogramWriter:
    """Observes many values into one histogram's slots with one NumPy call per batch.

    `observe_many(values, weights)` is how a step's inter-token latencies (interval/n, n
    times) land: bucket index by `searchsorted` (Prometheus' `le` semantics: a value equal to
    a bound counts in that bucket), counts added with `bincount`."""

    def __init__(self, array: np.ndarray, layout: Layout, name: str,
                 value: str | None = None) -> None:
        base, sum_at = layout.hist(name, value)
        self.bounds = np.asarray(layout.defs[name].buckets, dtype=np.float64)
        self.counts = array[base:sum_at]  # a view: writes land in the shared array
        self.sum_at, self.array = sum_at, array
        self.n = len(self.bounds) + 1

    def observe(self, value: float) -> None:
        self.counts[int(np.searchsorted(self.bounds, value, side="left"))] += 1
        self.array[self.sum_at] += value

    def observe_many(self, values: Sequence[float], weights: Sequence[int] | None = None
                     ) -> None:
        if not len(values):
            return
        v = np.asarray(values, dtype=np.float64)
        idx = np.searchsorted(self.bounds, v, side="left")
        if weights is None:
            self.counts += np.bincount(idx, minlength=self.n)
            self.array[self.sum_at] += float(v.sum())
        else:
            w = np.asarray(weights, dtype=np.float64)
            self.counts += np.bincount(idx, weights=w, minlength=self.n)
            self.array[self.sum_at] += float(v @ w)
