"""The compiled exposition (`server.stats.exposition`) writes exactly what prometheus_client's
`generate_latest` writes for the same families: counters, gauges with an extra label,
histograms (cumulated buckets, `+Inf`, `_count`, `_sum`), label values that need escaping,
series that are absent while their array is, values of every magnitude."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.utils import floatToGoString

from server.stats.exposition import Exposition, Scrape
from server.stats.layout import Layout, MetricDef

DEFS = [
    MetricDef("vllm:prompt_tokens", "counter", "Prompt tokens.\nSecond line \\ backslash."),
    MetricDef("vllm:waiting_by_reason", "gauge", "Waiting.", label="reason",
              values=("capacity", "deferred")),
    MetricDef("vllm:ttft_seconds", "histogram", "TTFT.", buckets=(0.001, 0.5, 1.0, 2.5)),
    MetricDef("vllm:tokens", "histogram", "Tokens by reason.", buckets=(1.0, 10.0),
              label="finished_reason", values=("stop", "length")),
]
LAYOUT = Layout(DEFS)
LABELS = [("model_name", 'meta "llama"\\3\n'), ("engine", "0")]


class Reference:
    """The same series through prometheus_client's families."""

    def __init__(self, arrays: list[np.ndarray | None]) -> None:
        self.arrays = arrays

    def collect(self):
        names = [k for k, _ in LABELS]
        for d in DEFS:
            extra = [d.label] if d.label else []
            cls = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily,
                   "histogram": HistogramMetricFamily}[d.kind]
            fam = cls(d.name, d.help, labels=names + extra)
            for arr in self.arrays:
                if arr is None:
                    continue
                at = LAYOUT.offset[d.name]
                for i, value in enumerate(d.values or (None,)):
                    lv = [v for _, v in LABELS] + ([value] if value else [])
                    if d.kind == "histogram":
                        n = len(d.buckets) + 2
                        counts = np.cumsum(arr[at + i * n: at + i * n + n - 1])
                        buckets = [(floatToGoString(b), float(c))
                                   for b, c in zip(d.buckets, counts, strict=False)]
                        buckets.append(("+Inf", float(counts[-1])))
                        fam.add_metric(lv, buckets, float(arr[at + i * n + n - 1]))
                    else:
                        fam.add_metric(lv, float(arr[at + i]))
            if fam.samples:
                yield fam


def render(arrays: list[np.ndarray | None]) -> tuple[str, str]:
    plan = Exposition()
    for k in range(len(arrays)):
        labels = LABELS if k == 0 else [("model_name", LABELS[0][1]), ("engine", str(k))]
        for d in DEFS:
            plan.add_def(d, labels, lambda s, k=k: s.engines[(0, k)], LAYOUT.offset[d.name])
    ours = plan.render(Scrape(np.zeros((0, 0)), {(0, k): a for k, a in enumerate(arrays)}, {}))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Reference(arrays[:1]))
    return ours, generate_latest(registry).decode()


def test_one_engine_renders_byte_for_byte_as_prometheus_client():
    rng = np.random.default_rng(7)
    arr = rng.integers(0, 1000, LAYOUT.size).astype(float)
    arr[0] = 1.5e21  # large and small magnitudes, as floatToGoString writes them
    arr[LAYOUT.slot("vllm:waiting_by_reason", "deferred")] = 1e-7
    ours, reference = render([arr])
    assert ours == reference
    assert 'model_name="meta \\"llama\\"\\\\3\\n"' in ours  # escaped once, as the reference
    assert "vllm:ttft_seconds_bucket" in ours and "vllm:prompt_tokens_total" in ours


def test_an_absent_engine_drops_its_series_and_an_empty_family_its_header():
    ours, reference = render([None])
    assert ours == "" and reference == ""
    arr = np.ones(LAYOUT.size)
    two, _ = render([arr, None])
    assert two.count("# TYPE vllm:ttft_seconds histogram") == 1
    assert 'engine="1"' not in two
