"""A pooling model's requests (vLLM's `pooling_params`: embeddings, scores) in the engine: one
ends, stopped, in the step that completes its prefill — chunked or not, after a prefix-cache
hit or a preemption — samples no token, frees its KV into the prefix cache, and costs what its
prefill costs on the placement. Admission refuses a generation of a pooling model and pooling
of a generative one, with vLLM's words."""

from __future__ import annotations

import random

import pytest
from engine_drive import drive, make, pooling_request, request

from devices import catalog
from server.engine.build import build_core
from server.engine.errors import InvalidRequest
from server.engine.intake import Limits, check_request
from server.engine.interface import EngineRequest, FinishReason, PoolingParams
from server.engine.options import EngineOptions
from server.engine.request import RequestStatus

EMBED = dict(name="e", model="qwen3-embedding-8b", quant="bf16", chip="h100-sxm", engine="vllm")


def test_a_chunked_prefill_ends_the_request_in_its_last_chunk():
    sched, model = make(num_blocks=64, block_size=16, max_num_batched_tokens=100,
                        max_model_len=1024)
    prompt = list(range(1, 251))  # three chunks of 100, 100, 50
    sched.add_request(pooling_request("p", prompt))
    steps = drive(sched, model)
    assert [len(f) for _, f in steps] == [0, 0, 1]
    (req,) = steps[-1][1]
    assert req.status is RequestStatus.FINISHED_STOPPED and req.finish_reason is FinishReason.STOP
    assert req.num_output_tokens == 0 and req.num_computed_tokens == 250
    assert sched.kv.num_available_blocks == 64  # nothing held (its blocks are cached)
    assert sched.kv.cache.evictable_blocks == 250 // 16


def test_the_same_prompt_again_is_served_from_the_prefix_cache_but_its_last_token():
    sched, model = make(num_blocks=64, block_size=16, max_model_len=1024)
    prompt = list(range(1, 101))
    for rid in ("a", "b"):
        sched.add_request(pooling_request(rid, prompt))
        drive(sched, model)
    assert sched.stats.num_prefill_tokens == 100 + 100 - 96  # b: 6 full blocks were cached


def test_pooling_and_generation_share_a_batch_and_only_generation_samples():
    rng = random.Random(1)
    sched, model = make(num_blocks=400, block_size=16, max_num_seqs=8, max_model_len=2048)
    for i in range(12):
        prompt = [rng.randrange(1, 999) for _ in range(rng.randrange(20, 300))]
        sched.add_request(pooling_request(f"p{i}", prompt) if i % 2 else
                          request(f"g{i}", prompt, 20, ignore_eos=True))
    done = {r.request_id: r for _, f in drive(sched, model) for r in f}
    assert len(done) == 12
    assert all(done[f"p{i}"].num_output_tokens == 0 for i in range(1, 12, 2))
    assert all(done[f"g{i}"].num_output_tokens == 20 for i in range(0, 12, 2))


def test_a_preempted_pooling_request_still_ends_with_its_prefill():
    sched, model = make(num_blocks=24, block_size=16, max_num_seqs=4, max_model_len=1024,
                        max_num_batched_tokens=64)
    sched.add_request(request("g", list(range(1, 100)), 200, ignore_eos=True))  # grows
    sched.add_request(pooling_request("p", list(range(500, 780))))  # its prefill is chunked
    done = {r.request_id: r for _, f in drive(sched, model) for r in f}
    assert done["p"].finish_reason is FinishReason.STOP and done["p"].num_output_tokens == 0
    assert done["g"].num_output_tokens == 200
    assert sched.stats.num_preemptions > 0  # (the case this test is for happened)


def test_a_pooling_step_costs_its_prefill_and_the_model_has_no_lm_head():
    spec = catalog.get_model("qwen3-embedding-8b")
    assert spec.head_params == 0 and spec.params == pytest.approx(spec.published_params, 0.01)
    core = build_core(EngineOptions(**EMBED))
    req = pooling_request("p", list(range(1000, 1512)))
    core.add_request(req)
    result = core.step(0.0)
    assert result is not None and [r.request_id for r in result.finished] == ["p"]
    assert result.new_tokens == {}
    # the step is the prefill of 512 tokens: at least the weights read once, at most what
    # the roofline gives the FLOPs of 512 tokens through every layer (no LM head) at peak
    placement = core.placement
    weights = spec.params * 2  # bf16
    chip = placement.chip
    assert result.seconds >= weights / chip.tiers[0].bandwidth_bps
    assert result.cost.flops == pytest.approx(2 * 512 * (spec.params - spec.embed_params),
                                              rel=0.15)


def limits(**pooling) -> Limits:
    return Limits(name="d", vocab_size=1000, max_model_len=64, num_blocks=8, block_size=16,
                  max_waiting=8, max_grammar_bytes=1000, **pooling)


@pytest.mark.parametrize("pool, model, says", [
    (None, {"pooling_task": "embed", "embedding_size": 8},
     "This model does not support generation"),
    (PoolingParams(), {}, "This model does not support pooling"),
])
def test_admission_refuses_the_other_task_with_vllms_words(pool, model, says):
    req = EngineRequest("r", prompt_token_ids=(1, 2, 3), pooling=pool)
    with pytest.raises(InvalidRequest, match=says):
        check_request(req, limits(**model), lambda s: [])


def test_a_pooling_prompt_may_fill_the_context_but_not_pass_it():
    pool = {"pooling_task": "embed", "embedding_size": 8}
    full = EngineRequest("r", prompt_token_ids=tuple(range(1, 65)), pooling=PoolingParams())
    assert check_request(full, limits(**pool), lambda s: []) == (list(range(1, 65)), 1)
    over = EngineRequest("r", prompt_token_ids=tuple(range(1, 66)), pooling=PoolingParams())
    with pytest.raises(InvalidRequest, match="prompt is 65 tokens"):
        check_request(over, limits(**pool), lambda s: [])


def test_the_scheduler_takes_a_pooling_prompt_that_fills_the_context():
    sched, model = make(num_blocks=64, block_size=16, max_model_len=128)
    with pytest.raises(ValueError, match="max_model_len is 128"):
        sched.add_request(request("g", list(range(1, 129)), 1))
    sched.add_request(pooling_request("p", list(range(1, 129))))
    (req,) = [r for _, f in drive(sched, model) for r in f]
    assert req.num_computed_tokens == 128 and req.finish_reason is FinishReason.STOP
