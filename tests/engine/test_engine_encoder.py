"""An encoder (BERT, XLM-RoBERTa: bidirectional attention) in the engine, as vLLM 0.33.0 runs
one: no KV cache (one null block, nothing allocated, usage 0), no prefix caching and no
chunked prefill by default, and an unchunked step budget of at least a whole prompt. Asked for
anyway, chunked prefill is honoured and the prefix cache stays off, each with vLLM's warning.
The same switch turns chunked prefill off for a decoder (`--no-enable-chunked-prefill`), with
vLLM's refusal of a budget below the context."""

from __future__ import annotations

import logging

import pytest
from engine_drive import drive, make, pooling_request, request

from server.engine.build import build_core
from server.engine.options import EngineOptions
from server.engine.request import RequestStatus

RERANKER = dict(name="r", model="bge-reranker-v2-m3", quant="f16", chip="h100-sxm",
                engine="vllm")


def test_an_encoder_keeps_no_kv_cache_and_neither_chunks_nor_caches():
    core = build_core(EngineOptions(**RERANKER))
    cfg = core.scheduler.config
    assert not cfg.kv_cache and cfg.num_blocks == 1  # vLLM's null block
    assert not cfg.enable_chunked_prefill and not cfg.enable_prefix_caching
    assert cfg.max_model_len == 8192 and cfg.max_num_batched_tokens >= cfg.max_model_len
    # a decoder on the same chip and engine keeps all three
    dec = build_core(EngineOptions(**{**RERANKER, "model": "qwen3-reranker-0.6b",
                                      "quant": "bf16"})).scheduler.config
    assert dec.kv_cache and dec.num_blocks > 1000 and dec.enable_chunked_prefill
    assert dec.enable_prefix_caching


def test_a_short_encoder_context_still_gets_the_engines_budget():
    # vLLM: max(max_model_len, the default) when chunked prefill is off and no budget given
    cfg = build_core(EngineOptions(**{**RERANKER, "model": "all-minilm-l6-v2"})).scheduler.config
    assert cfg.max_model_len == 256 and cfg.max_num_batched_tokens == 8192


def test_encoder_requests_run_whole_hold_nothing_and_never_hit_a_cache():
    sched, model = make(num_blocks=1, kv_cache=False, enable_chunked_prefill=False,
                        enable_prefix_caching=False, max_num_batched_tokens=2048,
                        max_model_len=2048, max_num_seqs=8)
    prompt = list(range(1, 1801))  # longer than half the budget: one per step
    for rid in ("a", "b", "c"):
        sched.add_request(pooling_request(rid, prompt))
    steps = drive(sched, model)  # (check_integrity after every step)
    assert [len(f) for _, f in steps] == [1, 1, 1]
    assert all(r.status is RequestStatus.FINISHED_STOPPED for _, f in steps for r in f)
    assert sched.stats.num_prefill_tokens == 3 * 1800  # computed whole, every time
    assert sched.stats.prefix_cache_queries == sched.stats.prefix_cache_hits == 0
    assert sched.kv.usage == 0.0 and sched.pool.num_free == 1


def test_many_encoder_requests_share_a_step_up_to_its_budget_and_seats():
    sched, model = make(num_blocks=1, kv_cache=False, enable_chunked_prefill=False,
                        enable_prefix_caching=False, max_num_batched_tokens=1000,
                        max_model_len=512, max_num_seqs=3)
    for i in range(7):
        sched.add_request(pooling_request(f"p{i}", list(range(1, 301))))
    finished_per_step = [len(f) for _, f in drive(sched, model)]
    assert finished_per_step == [3, 3, 1]  # 3 seats (900 of 1000 tokens), nothing held


def test_the_null_block_is_never_handed_out():
    sched, _ = make(num_blocks=1, kv_cache=False, enable_chunked_prefill=False,
                    enable_prefix_caching=False, max_num_batched_tokens=64, max_model_len=64)
    req = pooling_request("x", list(range(1, 65)))
    sched.add_request(req)  # 4 blocks' worth of tokens, admitted with no pool to speak of
    sched.schedule()
    assert req.block_ids == [] and sched.pool.num_free == 1
    req.block_ids.append(0)  # a block held on a model without a KV cache breaks integrity
    with pytest.raises(AssertionError, match="without a KV cache"):
        sched.check_integrity()


def test_asked_for_anyway_chunking_is_honoured_and_caching_stays_off(caplog):
    with caplog.at_level(logging.WARNING, logger="doppelchip.engine"):
        cfg = build_core(EngineOptions(**RERANKER, chunked_prefill=True, prefix_cache=True,
                                       max_num_batched_tokens=2048)).scheduler.config
    assert cfg.enable_chunked_prefill and cfg.max_num_batched_tokens == 2048
    assert not cfg.enable_prefix_caching
    said = [r.getMessage() for r in caplog.records]
    assert any("does not officially support chunked prefill" in m for m in said)
    assert any("does not officially support prefix caching" in m for m in said)


def test_a_decoder_without_chunked_prefill_takes_whole_prompts():
    opts = dict(name="g", model="llama-3.1-8b", quant="bf16", chip="h100-sxm", engine="vllm",
                max_model_len=16384)
    cfg = build_core(EngineOptions(**opts, chunked_prefill=False)).scheduler.config
    assert not cfg.enable_chunked_prefill and cfg.max_num_batched_tokens == 16384
    assert cfg.kv_cache and cfg.enable_prefix_caching  # (a decoder keeps its cache)
    core = build_core(EngineOptions(**opts, chunked_prefill=False))
    core.scheduler.add_request(request("long", list(range(1, 12001)), 4))
    out = core.scheduler.schedule()
    assert [s.num_new_tokens for s in out.scheduled] == [12000]  # one step, not 8192 + rest
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(8192\) is smaller than "
                                         r"max_model_len \(16384\)"):
        build_core(EngineOptions(**opts, chunked_prefill=False, max_num_batched_tokens=8192))


def test_an_encoder_has_no_kv_to_offload():
    with pytest.raises(ValueError, match="bge-reranker-v2-m3 keeps no KV cache"):
        build_core(EngineOptions(**RERANKER, kv_offloading_size=1.0))


def test_chunking_asked_of_an_engine_without_a_step_budget_takes_whole_contexts():
    # JetStream's catalogue entry has no budget: its prefills are whole; asked to chunk, a
    # chunk is at most the context (not one token at a time)
    opts = dict(name="j", model="llama-3.1-8b", quant="bf16", chip="tpu-v5e", engine="jetstream",
                max_model_len=2048, tp=8)
    cfg = build_core(EngineOptions(**opts, chunked_prefill=True)).scheduler.config
    assert cfg.enable_chunked_prefill and cfg.max_num_batched_tokens == 2048
    assert not build_core(EngineOptions(**opts)).scheduler.config.enable_chunked_prefill
