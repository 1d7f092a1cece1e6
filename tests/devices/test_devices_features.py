"""The 2026 physics, each checked against its formula: MLA's latent KV, sliding windows, MoE
expert touch and all-to-all, FP4 storage vs FP4 compute, parallelism relations, collectives
under tensor parallelism, kernel paths per architecture, launch modes, SRAM pipeline depth."""

from __future__ import annotations

import dataclasses

import pytest

from devices import (
    BatchShape,
    DeploymentSpec,
    PlacementError,
    catalog,
    estimate,
    fitted_factors,
    place,
    step_cost,
)
from devices.place_hbm import place_hbm
from devices.plan import compute_rate


def spec(model, quant, chip, engine="vllm", **kw) -> DeploymentSpec:
    return DeploymentSpec(model, quant, chip, engine, **kw)


def test_mla_caches_one_compressed_latent_per_token_and_layer():
    m = catalog.get_model("deepseek-v3")
    assert m.kv_bytes_per_token(1.0) == 61 * (512 + 64)  # (kv_lora_rank + rope dim) × layers
    gqa_equivalent = 2 * 61 * 128 * 128 * 1.0  # K and V for all 128 heads
    assert gqa_equivalent / m.kv_bytes_per_token(1.0) > 25
    # tensor parallel ranks cannot split the latent: each keeps all of it; attention data
    # parallel splits the sequences instead, so the same 8 GPUs hold far more tokens
    tp8 = place(spec("deepseek-v3", "fp8", "h200-sxm", count=8, tp=8, ep=8))
    dp8 = place(spec("deepseek-v3", "fp8", "h200-sxm", count=8, ep=8))
    assert (tp8.tp, tp8.dp, dp8.tp, dp8.dp) == (8, 1, 1, 8)
    assert dp8.kv_tokens > 4 * tp8.kv_tokens


def test_sliding_window_layers_hold_only_their_window():
    m = catalog.get_model("gpt-oss-120b")
    per_layer = 2 * 8 * 64 * 2.0
    assert m.kv_bytes_for_context(32768, 2.0) == per_layer * (18 * 32768 + 18 * 128)
    assert m.kv_bytes_for_context(100, 2.0) == per_layer * 36 * 100
    pl = place(spec("gpt-oss-120b", "mxfp4", "h100-sxm", max_context=65536))
    full = dataclasses.replace(m, sliding_layers=0)
    assert pl.kv_tokens * pl.model.kv_bytes_per_context_token(65536, 2.0) == pytest.approx(
        pl.kv_tokens * full.kv_bytes_per_token(2.0) * (18 * 65536 + 18 * 128) / (36 * 65536))
    # a decode at 64k context reads the full layers' 64k and the sliding layers' 128 tokens
    short = step_cost(pl, BatchShape(decode=(1000,)))
    long = step_cost(pl, BatchShape(decode=(64000,)))
    kv_tok_full = per_layer * 18  # bytes per context token, full layers only
    assert long.bytes - short.bytes == pytest.approx(kv_tok_full * 63000, rel=0.01)


@pytest.mark.parametrize("tokens", [1, 8, 64, 512])
def test_moe_experts_touched_follow_e_times_one_minus_one_minus_k_over_e_to_the_t(tokens):
    pl = place(spec("qwen3-235b-a22b", "fp8", "h200-sxm", count=8, ep=8))
    m = pl.model
    touched = 1 - (1 - 8 / 128) ** tokens  # all tokens of all 8 replicas reach each expert
    # each replica reads all its dense layers (FP8: 1 byte) and the LM head (16 bit: FP8
    # checkpoints leave it unquantised)
    dense = m.n_layers * m.dense_layer_params * 1.0 + m.head_params * 2.0
    experts = m.n_layers * m.mlp_params_per_layer * 1.0  # spread over the 8 chips once
    cost = step_cost(pl, BatchShape(decode=(0,) * tokens))
    kv_act = sum(s.kv_bytes_per_token + s.act_bytes_per_token
                 for st in pl.plan.stages for s in st.segments) * 8 * tokens
    assert cost.bytes - kv_act == pytest.approx(8 * dense + experts * touched, rel=0.01)


def test_expert_parallel_all_to_all_follows_the_formula():
    pl = place(spec("qwen3-235b-a22b", "fp8", "h200-sxm", count=8, ep=8))
    chip, m = pl.chip, pl.model
    t = 256
    cost = step_cost(pl, BatchShape(decode=(100,) * t))
    per_rank = t / 8 * m.n_active_experts * m.hidden * 2  # dispatched copies of its tokens
    a2a = chip.collective_base_s + 7 * chip.hop_latency_s + 7 / 8 * per_rank / chip.link_bw_bps
    assert cost.link_s == pytest.approx(m.n_moe_layers * 2 * a2a, rel=0.01)  # no TP all-reduce


def test_fp4_is_stored_at_4_bits_everywhere_but_computed_in_fp4_only_with_fp4_units():
    fp8, fp4 = catalog.get_quant("fp8"), catalog.get_quant("nvfp4")
    assert fp4.bytes_per_weight / fp8.bytes_per_weight == 4.5 / 8  # 4 bits + FP8 scale / 16
    assert catalog.get_quant("mxfp4").bytes_per_weight == 4.25 / 8
    vllm = catalog.get_engine("vllm")
    table = fitted_factors()
    for chip_id in ("h100-sxm", "h200-sxm", "b200", "gb200", "mi300x", "mi355x"):
        chip = catalog.get_chip(chip_id)
        a = place(spec("llama-3.1-70b", "fp8", chip_id, count=4))
        b = place(spec("llama-3.1-70b", "nvfp4", chip_id, count=4))
        edges = 2.0 * 2 * b.model.embed_params  # embedding and head: 16 bit in both formats
        assert ((b.weight_bytes[0][1] - edges) / (a.weight_bytes[0][1] - edges)
                == pytest.approx(4.5 / 8))
        f = table[("vllm", chip.chip_class)]
        r4, r8 = compute_rate(vllm, chip, fp4, f), compute_rate(vllm, chip, fp8, f)
        if chip.has_units("fp4"):
            assert r4 == pytest.approx(2 * r8), chip_id
        else:  # dequantised into 16-bit matmuls: slower than the FP8 path
            assert r4 == pytest.approx(chip.flops("bf16") * f.flop_eff) and r4 < r8, chip_id


def test_gpt_oss_120b_in_mxfp4_fits_one_80gb_gpu():
    assert place(spec("gpt-oss-120b", "mxfp4", "h100-sxm")).chips == 1
    with pytest.raises(PlacementError, match="does not fit"):
        place(spec("gpt-oss-120b", "bf16", "h100-sxm"))


def test_tp8_decode_is_bounded_by_bandwidth_over_8_plus_collective_latency():
    s8 = place(spec("llama-3.1-70b", "bf16", "h100-sxm", count=8))
    s4 = place(spec("llama-3.1-70b", "bf16", "h100-sxm", count=4))
    chip, m = s8.chip, s8.model
    t8 = step_cost(s8, BatchShape(decode=(500,))).seconds
    t4 = step_cost(s4, BatchShape(decode=(500,))).seconds
    bandwidth_floor = m.params * 2 / 8 / chip.tier.bandwidth_bps
    allreduce = chip.collective_base_s + 2 * 7 * chip.hop_latency_s
    assert t8 > bandwidth_floor + 2 * m.n_layers * allreduce
    assert t4 / t8 < 1.6  # doubling the GPUs does not halve the step: fixed costs stay


def test_count_tp_pp_dp_ep_relations():
    cases = [({"count": 8, "ep": 8}, (1, 1, 8, 8)), ({"tp": 8, "ep": 8}, (8, 1, 1, 8)),
             ({"count": 16, "tp": 8, "ep": 16}, (8, 1, 2, 16)), ({"count": 8}, (8, 1, 1, 1)),
             ({"ep": 4}, (1, 1, 4, 4)), ({"count": 8, "tp": 4, "pp": 2}, (4, 2, 1, 1))]
    for kw, want in cases:
        pl = place(spec("qwen3-235b-a22b", "fp8", "h200-sxm", **kw))
        assert (pl.tp, pl.pp, pl.dp, pl.ep) == want, kw
        assert pl.chips == pl.tp * pl.pp * pl.dp
    for kw, why in (({"count": 8, "ep": 3}, "must divide"), ({"count": 8, "tp": 3}, "tp")):
        with pytest.raises(PlacementError, match=why):
            place(spec("qwen3-235b-a22b", "fp8", "h200-sxm", **kw))
    with pytest.raises(PlacementError, match="no experts"):
        place(spec("llama-3.1-70b", "fp8", "h200-sxm", count=8, ep=8))


def test_fp8_kv_cache_doubles_the_kv_tokens():
    auto = place(spec("llama-3.1-8b", "bf16", "h100-sxm"))
    fp8 = place(spec("llama-3.1-8b", "bf16", "h100-sxm", kv_cache_dtype="fp8"))
    assert fp8.kv_tokens == pytest.approx(2 * auto.kv_tokens, rel=0.001)
    with pytest.raises(PlacementError, match="kv_cache_dtype"):
        place(spec("llama-3.1-8b", "bf16", "h100-sxm", kv_cache_dtype="int3"))


def test_llamacpp_kernel_paths_differ_by_architecture():
    """MMQ's mma.sync reaches half of Hopper's INT8 peak (it needs wgmma for all of it); F16
    weights go through cuBLAS with FP16 accumulate, twice the FP32-accumulate rate on Ada."""
    cpp = catalog.get_engine("llama.cpp")
    h100, ada, a100 = (catalog.get_chip(c) for c in ("h100-sxm", "rtx-4090", "a100-sxm-80g"))
    q4, f16 = catalog.get_quant("q4_0"), catalog.get_quant("f16")
    unit = dataclasses.replace(fitted_factors()[("llama.cpp", "nvidia-datacentre")], flop_eff=1)
    assert compute_rate(cpp, h100, q4, unit) == pytest.approx(h100.flops("int8") / 2, rel=0.01)
    assert compute_rate(cpp, a100, q4, unit) == a100.flops("int8")  # mma.sync is Ampere's own
    assert compute_rate(cpp, ada, f16, unit) == 2 * ada.flops("fp16")
    assert compute_rate(cpp, h100, f16, unit) == h100.flops("fp16")


def test_eager_launch_costs_time_when_the_host_is_slower_than_the_device():
    """An eager engine cannot finish a step before the host has launched every kernel; graph
    replay removes the per-kernel launches. (A slow host makes the small step launch-bound.)"""
    s = spec("llama-3.1-8b", "fp8", "h100-sxm")
    model, quant = catalog.get_model(s.model), catalog.get_quant(s.quant)
    chip = dataclasses.replace(catalog.get_chip(s.chip), launch_s=20e-6)
    graph = catalog.get_engine("vllm")
    eager = dataclasses.replace(graph, launch="eager")
    table = fitted_factors()
    pg = place_hbm(s, model, quant, chip, graph, table)
    pe = place_hbm(s, model, quant, chip, eager, table)
    small, big = BatchShape(decode=(100,)), BatchShape(prefill=((4096, 0),))
    launches = model.n_layers * graph.kernels_per_layer * chip.launch_s
    assert step_cost(pe, small).seconds >= launches > step_cost(pg, small).seconds
    assert step_cost(pe, big).seconds == step_cost(pg, big).seconds  # GPU-bound: hidden


def test_sram_pipeline_is_as_deep_as_the_model_and_hops_over_one_link():
    groq = place(spec("llama-2-70b", "f16", "groq-lpu-v1", "groq", count=576))
    assert (groq.pp, groq.tp) == (80, 7)  # 80 stages of ~7 chips each
    chip = groq.chip
    assert groq.plan.hop_tok_s == pytest.approx(8192 * 2 / chip.lane_bw_bps)
    assert groq.plan.n_hops == 79
    # per-token latency: 79 hops + 80 stages, whatever the chip count beyond the layers
    t = step_cost(groq, BatchShape(decode=(100,)))
    hops = 79 * (chip.hop_latency_s + 8192 * 2 / chip.lane_bw_bps)
    assert t.link_s >= hops


@pytest.mark.parametrize(
    ("model", "quant", "chip", "engine", "kw"),
    [("deepseek-v3", "fp8", "h200-sxm", "vllm", {"count": 8, "ep": 8}),
     ("gpt-oss-120b", "mxfp4", "b200", "vllm", {}),
     ("gpt-oss-120b", "mxfp4", "mi355x", "vllm", {}),
     ("qwen3-235b-a22b", "bf16", "tpu-v7", "jetstream", {"count": 4})],
    ids=["dsv3-8xh200-ep", "gpt-oss-b200", "gpt-oss-mi355x", "qwen3-tpu-v7"],
)
def test_the_issues_estimates_answer(model, quant, chip, engine, kw):
    r = estimate(spec(model, quant, chip, engine, **kw), 1024, 256, 8)
    assert r["fits"], r
    assert r["decode_tokens_per_s"] > 0 and r["usd_per_mtok"] > 0


def test_rocm_and_tpu_profiles_come_from_the_chip_class():
    table = fitted_factors()
    for engine in ("vllm", "sglang"):
        f = table[(engine, "amd-instinct")]
        assert all(f.provenance_of(n).kind == "borrowed" for n in ("bw_eff", "flop_eff"))
        assert place(spec("llama-3.1-70b", "fp8", "mi300x", engine)).chip.vendor == "amd"
    with pytest.raises(PlacementError, match="runs on"):
        place(spec("llama-3.1-8b", "fp8", "mi300x", "tensorrt-llm"))
    assert place(spec("llama-3.1-70b", "bf16", "tpu-v7", "jetstream", count=2)).chips == 2


def test_wide_expert_parallelism_across_nodes_pays_the_network():
    """ep 16 on 8-GPU H200 boxes: the all-to-all's steps that leave the box cross InfiniBand
    (NCCL's network step latency, 50 GB/s per GPU) instead of NVLink."""
    node = place(spec("deepseek-v3", "fp8", "h200-sxm", count=8, ep=8))
    wide = place(spec("deepseek-v3", "fp8", "h200-sxm", count=16, ep=16))
    chip = wide.chip
    assert (wide.dp, wide.ep, chip.domain_size) == (16, 16, 8)
    seg_node = node.plan.stages[0].segments[0]
    seg_wide = wide.plan.stages[0].segments[0]
    per_layer = lambda seg: seg.coll_fixed_s / (2 * node.model.n_moe_layers)  # noqa: E731
    assert per_layer(seg_node) == pytest.approx(chip.collective_base_s + 7 * chip.hop_latency_s)
    assert per_layer(seg_wide) > per_layer(seg_node)
    assert seg_wide.coll_tok_s * 16 > seg_node.coll_tok_s * 8  # slower bytes per rank, too


def test_prefix_cache_hit_prefill_still_attends_over_the_cached_prefix():
    pl = place(spec("llama-3.1-8b", "bf16", "h100-sxm"))
    cold = step_cost(pl, BatchShape(prefill=((4096, 0),)))
    hit = step_cost(pl, BatchShape(prefill=((96, 4000),)))  # 4,000 tokens served from cache
    tiny = step_cost(pl, BatchShape(prefill=((96, 0),)))
    assert hit.seconds < cold.seconds / 10
    assert hit.flops > tiny.flops  # the new tokens attend to the cached 4,000
    assert hit.bytes > tiny.bytes  # and read their KV
