"""P/D in the scheduler: a decode-side request whose prompt KV it pulled computes only its last
prompt token (as vLLM's NIXL connector does) and yields the aggregated tokens; a
prefill-side request keeps its KV after finishing until released, with the pool's invariants."""

from __future__ import annotations

import pytest
from engine_drive import make, request, run, step

from server.engine.kv_pulls import RemotePulls


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_a_pulled_prompt_is_not_prefilled_and_outputs_match(prefix_cache):
    prompt = [(7 * i) % 997 + 1 for i in range(100)]
    agg, model = make(num_blocks=64, block_size=16, enable_prefix_caching=prefix_cache)
    agg.add_request(request("r", prompt, 20, ignore_eos=True))
    expected = run(agg, model)["r"].output_token_ids

    dec, model = make(num_blocks=64, block_size=16, enable_prefix_caching=prefix_cache)
    ended = []
    dec.attach_pulls(RemotePulls(lambda rid, n, start: start,  # a link that takes no time
                                 lambda rid, landed: ended.append((rid, landed))))
    req = request("r", prompt, 20, ignore_eos=True)
    req.num_remote_tokens = len(prompt) - 1
    dec.add_request(req)
    assert dec.schedule().scheduled == ()  # the pull starts; it lands at the next step
    dec.check_integrity()
    out = dec.schedule()
    (first,) = out.scheduled
    assert first.num_new_tokens == 1 and first.start_position == len(prompt) - 1
    dec.update(out, model.next_tokens(out, dec.requests))
    done = run(dec, model)
    assert done["r"].output_token_ids == expected
    assert dec.stats.num_prefill_tokens == 1  # only the last prompt token was computed
    assert agg.stats.num_prefill_tokens == len(prompt)
    assert dec.stats.external_prefix_cache_hits == len(prompt) - 1
    assert done["r"].num_cached_tokens == len(prompt) - 1
    assert ended == [("r", True)]


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_a_held_prefill_keeps_its_blocks_until_released(prefix_cache):
    sched, model = make(num_blocks=16, block_size=16, enable_prefix_caching=prefix_cache)
    req = request("p", list(range(1, 41)), 1, ignore_eos=True)
    req.hold_kv = True
    sched.add_request(req)
    (done,) = step(sched, model)
    assert done.finish_reason.value == "length"
    blocks, _ = sched.held["p"]
    assert len(blocks) == 3  # 41 tokens in blocks of 16
    sched.check_integrity()
    free_held = sched.pool.num_free + sched.cache.evictable_blocks
    assert free_held == 16 - 3  # held blocks are neither free nor evictable
    assert sched.release_held("p") and not sched.release_held("p")
    sched.check_integrity()
    assert sched.pool.num_free + sched.cache.evictable_blocks == 16


def test_a_stopped_prefill_holds_nothing():
    sched, model = make(num_blocks=16, block_size=16)
    req = request("p", list(range(1, 41)), 1, ignore_eos=True)
    sched.add_request(req)
    step(sched, model)
    assert sched.held == {}  # hold_kv not set: freed at once
