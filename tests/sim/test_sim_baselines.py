"""What each idea buys, measured by simulate on the same device and the same workload."""

from __future__ import annotations

import dataclasses

import pytest

from clients.workloads import WorkloadSpec
from devices import catalog
from server.engine.options import EngineOptions
from sim.simulation import simulate_options

H100 = EngineOptions(name="h100", model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                     engine="vllm")


def test_paging_and_continuous_batching_beat_contiguous_static():
    """Same KV bytes, same requests: a contiguous layout reserves each request's maximum length
    (prompt + max_tokens) up front, paging holds only what each request has written so far.
    Max concurrency rises by about max length ÷ mean length (the vLLM paper's argument)."""
    isl, max_tokens, out = 200, 3896, 56  # max length 4096; actual length 256 (EOS included)
    block = H100.block_size or catalog.get_engine(H100.engine).block_size_on(
        catalog.get_chip(H100.chip))  # the deployment's KV block size
    pool = 64 * (isl + max_tokens) // block  # room for 64 maximum-length requests
    common = dict(max_model_len=4096, max_num_seqs=4096, prefix_cache=False, kv_blocks=pool,
                  output_len_mean=out, output_len_dist="fixed")
    paged = dataclasses.replace(H100, kv_layout="paged", batching="continuous", **common)
    contiguous = dataclasses.replace(H100, kv_layout="contiguous", batching="static", **common)
    workload = WorkloadSpec(num_requests=800, isl=isl, osl=max_tokens, ignore_eos=False)
    a = simulate_options(paged, workload)
    b = simulate_options(contiguous, workload)
    assert b["peak_running"] == 64  # every request reserves a whole 4096-token region
    mean_len = isl + a["output_tokens"] / a["requests"]
    assert mean_len == 256
    ratio = a["peak_running"] / b["peak_running"]
    assert ratio == pytest.approx((isl + max_tokens) / mean_len, rel=0.25)
    assert a["output_tokens"] == b["output_tokens"]  # the same tokens, whatever the layout
    assert a["output_tokens_per_s"] > 1.3 * b["output_tokens_per_s"]  # measured: 1.54x


def test_radix_cache_prefills_far_fewer_tokens_on_shared_prefixes():
    workload = WorkloadSpec(kind="shared-prefix", num_requests=64, num_prefixes=2,
                            system_prompt_len=1000, isl=40, osl=8, ignore_eos=True)
    on = simulate_options(dataclasses.replace(H100, prefix_cache=True), workload)
    off = simulate_options(dataclasses.replace(H100, prefix_cache=False), workload)
    assert off["prefill_tokens"] == 64 * 1040 and off["cached_prompt_tokens"] == 0
    assert on["prefill_tokens"] < off["prefill_tokens"] / 5
    assert on["prefix_cache_hit_rate"] > 0.8
    assert on["ttft_s"]["mean"] < off["ttft_s"]["mean"]


def test_groq_recompiles_under_varied_traffic_but_not_when_holding_its_shape():
    groq = EngineOptions(name="groq", model="llama-2-70b", quant="f16", chip="groq-lpu-v1",
                         engine="groq", max_num_seqs=4, batching="continuous")
    workload = WorkloadSpec(num_requests=40, isl=64, osl=16, rate=2.0, seed=1)
    hold = simulate_options(groq, workload)
    varied = simulate_options(dataclasses.replace(groq, shape_policy="recompile"), workload)
    assert hold["compiles"] == 0 and hold["compile_stall_s"] == 0
    assert varied["compiles"] > 1 and varied["compile_stall_s"] > 0
    assert varied["e2e_s"]["p90"] > hold["e2e_s"]["p90"]


def test_groq_pipeline_serves_more_users_at_the_same_per_user_speed():
    """Hundreds of pipeline stages: more sequences fill more micro-batches in flight, so
    throughput rises with the batch while each user's time per token stays the same."""
    workload = WorkloadSpec(num_requests=32, isl=64, osl=32, ignore_eos=True)
    runs = {
        seqs: simulate_options(
            EngineOptions(name="groq", model="llama-2-70b", quant="f16", chip="groq-lpu-v1",
                          engine="groq", max_num_seqs=seqs, max_model_len=2048), workload)
        for seqs in (1, 16)
    }
    assert runs[16]["tpot_s"]["p50"] == pytest.approx(runs[1]["tpot_s"]["p50"], rel=0.02)
    assert runs[16]["output_tokens_per_s"] > 10 * runs[1]["output_tokens_per_s"]
    assert runs[16]["usd_per_mtok"] < runs[1]["usd_per_mtok"] / 10
