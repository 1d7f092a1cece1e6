"""What reads the prefix cache, and what vLLM counts as a lookup: nothing without the cache,
and nothing for a request that asks its prompt's logprobs (vLLM's `skip_reading_prefix_cache`:
its whole prompt is computed, and its full blocks still go into the cache for the others)."""

from __future__ import annotations

from engine_drive import drive, make, pooling_request, request, run

from server.engine.interface import SamplingParams
from server.engine.request import Request


def test_without_the_prefix_cache_nothing_is_looked_up():
    # vLLM counts prefix-cache queries only where the cache is looked up
    sched, model = make(num_blocks=64, block_size=16, max_model_len=1024,
                        enable_prefix_caching=False)
    for rid in ("a", "b"):
        sched.add_request(pooling_request(rid, list(range(1, 101))))
        drive(sched, model)
    assert sched.stats.prefix_cache_queries == 0 and sched.stats.num_prefill_tokens == 200
    on, model = make(num_blocks=64, block_size=16, max_model_len=1024)
    on.add_request(pooling_request("a", list(range(1, 101))))
    drive(on, model)
    assert on.stats.prefix_cache_queries == 100


def test_a_request_that_skips_reading_the_cache_computes_its_whole_prompt():
    sched, model = make(num_blocks=64, block_size=16, max_model_len=1024)
    prompt = list(range(1, 101))
    sched.add_request(request("a", prompt, 2, ignore_eos=True))
    run(sched, model)
    skip = Request("b", prompt, SamplingParams(max_tokens=2, ignore_eos=True,
                                               skip_reading_prefix_cache=True))
    sched.add_request(skip)
    before = (sched.stats.prefix_cache_queries, sched.stats.num_prefill_tokens)
    run(sched, model)
    assert skip.num_cached_tokens == 0
    assert sched.stats.prefix_cache_queries == before[0]  # not a lookup (vLLM's counters)
    assert sched.stats.num_prefill_tokens - before[1] == 100
    sched.add_request(request("c", prompt, 2, ignore_eos=True))  # the others still hit
    run(sched, model)
    assert sched.stats.prefix_cache_hits == 96 and sched.stats.prefix_cache_queries == 200
