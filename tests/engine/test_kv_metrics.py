"""vLLM's KV residency metrics (`--kv-cache-metrics`) from the scheduler's real pool and radix
cache: a sampled block's lifetime, idle time before eviction and reuse gaps, on the clock the
engine loop sets (here: 10 emulated seconds between the requests of a scenario)."""

from __future__ import annotations

import pytest
from engine_drive import make, request, step

from server.engine.kv_metrics import HISTORY, KVCacheMetricsCollector

PROMPT = list(range(1, 33))  # two full 16-token blocks


def scheduler(sample: float = 1.0, **config: object):
    sched, model = make(num_blocks=8, block_size=16, max_num_seqs=4,
                        max_num_batched_tokens=512, max_model_len=128, **config)
    metrics = KVCacheMetricsCollector(sample, evictions=sched.config.enable_prefix_caching)
    sched.pool.metrics = metrics
    return sched, model, metrics


def serve(sched, model, metrics, req, t: float) -> None:
    """Run `req` alone to its end, its steps at t, t+1, ... (the loop sets `now` per step)."""
    sched.add_request(req)
    n = 0
    while sched.has_unfinished():
        metrics.now = t + n
        n += 1
        step(sched, model)
        sched.check_integrity()


def test_an_evicted_cached_block_reports_its_life() -> None:
    sched, model, metrics = scheduler()
    serve(sched, model, metrics, request("a", PROMPT, max_tokens=1), 0)  # computes the prefix
    serve(sched, model, metrics, request("b", PROMPT + [40] * 8, max_tokens=1), 10)  # hits it
    serve(sched, model, metrics, request("c", PROMPT + [41] * 8, max_tokens=1), 20)  # again
    assert sched.cache.cached_blocks == 2
    metrics.drain_events()
    # 100 tokens need 7 of the 8 blocks: one of the two cached prefix blocks is evicted
    serve(sched, model, metrics, request("d", [7] * 100, max_tokens=1), 30)
    cached = [e for e in metrics.drain_events() if e.reuse_gaps_seconds]
    assert len(cached) == 1
    event = cached[0]
    assert event.lifetime_seconds == 30  # computed at 0, evicted at 30
    assert event.idle_seconds == 10  # last hit at 20
    assert event.reuse_gaps_seconds == (10,)  # hits at 10 and 20
    survivor = [s for s in metrics.blocks.values() if s.birth == 0]
    assert len(survivor) == 1 and list(survivor[0].history) == [10, 20]


def test_a_block_reused_without_a_hit_has_no_reuse_gap() -> None:
    sched, model, metrics = scheduler()
    serve(sched, model, metrics, request("a", [3] * 40, max_tokens=1), 0)
    metrics.drain_events()
    serve(sched, model, metrics, request("b", [5] * 40, max_tokens=1), 7)
    events = metrics.drain_events()
    assert events and all(e.reuse_gaps_seconds == () for e in events)
    assert all(e.lifetime_seconds == e.idle_seconds == 7 for e in events)


def test_only_the_last_accesses_make_gaps() -> None:
    sched, model, metrics = scheduler()
    serve(sched, model, metrics, request("a", PROMPT, max_tokens=1), 0)
    for i in range(6):  # six hits, 5 s apart
        serve(sched, model, metrics, request(f"h{i}", PROMPT + [50 + i] * 4, max_tokens=1),
              10 + 5 * i)
    metrics.drain_events()
    serve(sched, model, metrics, request("big", [7] * 100, max_tokens=1), 100)
    gaps = [e.reuse_gaps_seconds for e in metrics.drain_events() if e.reuse_gaps_seconds]
    assert gaps == [(5,) * (HISTORY - 1)]  # a ring of the last four accesses


def test_without_prefix_caching_nothing_is_evicted() -> None:
    sched, model, metrics = scheduler(enable_prefix_caching=False)
    for i, t in enumerate((0, 10, 20)):
        serve(sched, model, metrics, request(f"r{i}", [3 + i] * 100, max_tokens=1), t)
    assert metrics.blocks and metrics.drain_events() == []  # as vLLM: blocks reused, no event


def test_a_cache_reset_forgets_the_sampled_blocks() -> None:
    sched, model, metrics = scheduler()
    serve(sched, model, metrics, request("a", PROMPT, max_tokens=1), 0)
    serve(sched, model, metrics, request("b", [9] * 100, max_tokens=1), 5)  # evicts one
    assert metrics.blocks and metrics.events
    assert sched.cache.reset()
    assert metrics.blocks == {} and metrics.events == []


def test_sampling_follows_the_rate_and_the_seed() -> None:
    rates = []
    for seed in (0, 1):
        m = KVCacheMetricsCollector(0.25, seed=seed)
        m.on_allocated(range(4000))
        rates.append(sorted(m.blocks))
    assert all(800 < len(r) < 1200 for r in rates) and rates[0] != rates[1]
    again = KVCacheMetricsCollector(0.25, seed=0)
    again.on_allocated(range(4000))
    assert sorted(again.blocks) == rates[0]


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5, float("nan")])
def test_the_rate_is_checked(rate: float) -> None:
    with pytest.raises(ValueError, match=r"kv_cache_metrics_sample must be in \(0, 1\]"):
        KVCacheMetricsCollector(rate)
