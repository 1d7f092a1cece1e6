"""Streamed latency statistics (clients/quantiles.py): exact below the bound, within the
stated relative error above it, in bounded memory; and the streamed summary."""

from __future__ import annotations

import numpy as np
import pytest

import clients.quantiles as quantiles
from clients.quantiles import ALPHA, Quantiles
from clients.report import PERCENTILES, RequestResult, SummaryStream, goodput, summarize


def _lognormal(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(mean=-4.0, sigma=1.2, size=n)


def test_exact_below_the_bound_is_numpy_itself():
    values = _lognormal(5000)
    q = Quantiles()
    for v in values[:1000].tolist():
        q.add(v)
    q.extend(values[1000:3000])  # an array
    q.extend(values[3000:].tolist())  # a list
    assert q.exact and q.count == 5000
    s = q.stats(PERCENTILES)
    assert s["mean"] == float(values.mean())
    for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES), strict=True):
        assert s[f"p{p}"] == float(v)


def test_gaps_of_many_runs_are_each_runs_own_gaps_in_order(monkeypatch):
    """`extend_gaps` (a request's inter-token gaps, differenced in bulk when sealed) keeps
    exactly the gaps within each run, in order, never one from a run's end to the next's
    start — across seals too (a small chunk forces several)."""
    monkeypatch.setattr(quantiles, "_CHUNK", 50)
    rng = np.random.default_rng(4)
    runs = [np.cumsum(rng.exponential(0.01, rng.integers(1, 30))) + 100.0 * i
            for i in range(40)]
    q = Quantiles()
    for r in runs:
        q.extend_gaps(tuple(r.tolist()))
    expected = np.concatenate([np.diff(r) for r in runs])
    assert q.count == len(expected) > 100
    assert np.array_equal(q.values(), expected)  # no 100-s jump between runs, same order
    s = q.stats(PERCENTILES)
    assert s["mean"] == float(expected.mean()) and s["p99"] == float(np.percentile(expected, 99))


def test_past_the_bound_every_percentile_is_within_alpha_of_its_order_statistic(monkeypatch):
    monkeypatch.setattr(quantiles, "EXACT_MAX", 1000)
    values = _lognormal(60_000, seed=3)
    q = Quantiles()
    q.extend(values[:20_000])
    for v in values[20_000:40_000].tolist():
        q.add(v)
    q.extend(values[40_000:].tolist())
    assert not q.exact and q.count == len(values)
    ordered = np.sort(values)
    s = q.stats((1, 10, 50, 90, 95, 99, 99.9))
    for p in (1, 10, 50, 90, 95, 99, 99.9):
        truth = ordered[round(p / 100 * (len(values) - 1))]
        assert abs(s[f"p{p}"] - truth) <= ALPHA * truth * (1 + 1e-9), (p, s[f"p{p}"], truth)
    assert s["mean"] == pytest.approx(values.mean(), rel=1e-12)
    # bounded memory: no value kept, one counter per bucket the data's range spans
    assert q._chunks == [] and q._pending == []
    span = np.log(values.max() / values.min()) / np.log((1 + ALPHA) / (1 - ALPHA))
    assert len(q._buckets) <= span + 2
    with pytest.raises(ValueError):
        q.values()


def test_zeros_are_counted_exactly_in_the_sketch(monkeypatch):
    monkeypatch.setattr(quantiles, "EXACT_MAX", 10)
    q = Quantiles()
    q.extend([0.0] * 600 + [0.5] * 400)
    s = q.stats((50, 59, 61, 99))
    assert s["p50"] == 0.0 and s["p59"] == 0.0
    assert s["p61"] == pytest.approx(0.5, rel=ALPHA) and s["p61"] > 0
    assert s["mean"] == pytest.approx(0.2)
    assert Quantiles().stats((50,)) == {"mean": 0.0, "p50": 0.0}


def _results(n: int) -> list[RequestResult]:
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        at = i * 0.1
        if i % 17 == 5:  # refused
            out.append(RequestResult(f"r{i}", at, at, (), at, 10, 0, finish_reason="error",
                                     error="RESOURCE_EXHAUSTED"))
            continue
        gaps = rng.exponential(0.01, size=int(rng.integers(1, 30)))
        times = tuple((at + 0.05 + np.cumsum(gaps)).tolist())
        out.append(RequestResult(f"r{i}", at, at, times, times[-1] + 0.001, 100 + i,
                                 len(times), cached_tokens=i % 3))
    return out


def test_the_streamed_summary_is_the_summary_of_the_list_and_keeps_no_result():
    results = _results(400)
    stream = SummaryStream(slo={"ttft": 0.06, "tpot": 0.012})
    for r in results:
        stream.add(r)
    assert stream.records is None  # nothing kept
    s = stream.summary(extra=1)
    ok = [r for r in results if r.ok]
    assert s["requests"] == len(ok) and s["errors"] == {"RESOURCE_EXHAUSTED": 400 - len(ok)}
    assert s["prompt_tokens"] == sum(r.prompt_tokens for r in ok)
    assert s["cached_prompt_tokens"] == sum(r.cached_tokens for r in ok)
    itl = np.concatenate([np.diff(r.token_times) for r in ok if len(r.token_times) > 1])
    assert s["itl_s"]["mean"] == float(itl.mean())
    assert s["itl_s"]["p99"] == float(np.percentile(itl, 99))
    ttft = [r.token_times[0] - r.scheduled_s for r in ok]
    assert s["ttft_s"]["p50"] == float(np.percentile(ttft, 50))
    span = max(r.end_s for r in results) - min(r.scheduled_s for r in results)
    assert s["duration_s"] == span and s["extra"] == 1
    assert summarize(results, extra=1) == s
    good = sum(1 for r in ok if r.ttft <= 0.06 and (r.tpot is None or r.tpot <= 0.012))
    assert 0 < good < len(ok)
    assert stream.goodput() == goodput(results, stream.slo) == {
        "requests_per_s": good / span, "fraction": good / len(results)}
    kept = SummaryStream(keep=True)
    for r in results:
        kept.add(r)
    assert kept.records == results and kept.summary(extra=1) == s
