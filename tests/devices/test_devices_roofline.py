"""Hand-computed roofline values: the cost model must match them to 1%.

Model figures are typed in from the published configs (not read from the catalogue), and the
fitted factors are read from the placement, so these check the arithmetic of the cost model.
"""

from __future__ import annotations

import pytest

from devices import BatchShape, DeploymentSpec, place, step_cost

# meta-llama/Llama-3.1-8B config.json
L8, H8, F8, KV8, V8 = 32, 4096, 14336, 8, 128256
LAYER8 = (H8 * H8 * 2 + 2 * H8 * KV8 * 128 + 2 * H8) + 3 * H8 * F8
# meta-llama/Llama-3.1-70B config.json
L70, H70, F70, KV70, V70 = 80, 8192, 28672, 8, 128256
LAYER70 = (H70 * H70 * 2 + 2 * H70 * KV70 * 128 + 2 * H70) + 3 * H70 * F70


def _factors(placement, cls):
    return dict(placement.factors)[cls]


def test_layer_params_match_catalogue():
    from devices import catalog

    assert catalog.get_model("llama-3.1-8b").layer_params == LAYER8 == 218_112_000
    assert catalog.get_model("llama-3.1-70b").layer_params == LAYER70


def test_bandwidth_bound_decode_h100():
    pl = place(DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm"))
    f = _factors(pl, "nvidia-datacentre")
    weights = (L8 * LAYER8 + V8 * H8) * 2  # every layer + LM head, read once
    kv = (1000 + 1) * 2 * L8 * KV8 * 128 * 2  # read 1000 tokens of K and V, write 1
    act = 10 * 2 * H8 * 2 * L8  # vLLM: 10 kernels × (write + read) of a 16-bit hidden vector
    expected = (weights + kv + act) / (3.35e12 * f.bw_eff) + L8 * 10 * f.kernel_s
    cost = step_cost(pl, BatchShape(decode=(1000,)))
    assert cost.bound == "memory"
    assert cost.seconds == pytest.approx(expected, rel=0.01)
    assert cost.bytes == pytest.approx(weights + kv + act, rel=0.01)


def test_compute_bound_prefill_h100():
    pl = place(DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm"))
    f = _factors(pl, "nvidia-datacentre")
    n = 4096
    flops = 2 * L8 * LAYER8 * n  # linear layers
    flops += 4 * 32 * 128 * L8 * (n * (n + 1) / 2)  # causal attention: QK^T and PV
    flops += 2 * V8 * H8  # logits of the last token only
    expected = flops / (989e12 * f.flop_eff) + L8 * 10 * f.kernel_s
    cost = step_cost(pl, BatchShape(prefill=((n, 0),)))
    assert cost.bound == "compute"
    assert cost.flops == pytest.approx(flops, rel=0.01)
    assert cost.seconds == pytest.approx(expected, rel=0.01)


def test_two_tier_decode_llamacpp_offload():
    """llama.cpp, 70B Q4_K_M, 40 layers in the 4090's VRAM and 40 + LM head on the CPU."""
    pl = place(DeploymentSpec("llama-3.1-70b", "q4_k_m", "rtx-4090", "llama.cpp",
                              n_gpu_layers=40))
    fg, fc = _factors(pl, "nvidia-consumer"), _factors(pl, "cpu")
    bpw, ctx = 0.605, 100
    kv_layer = (ctx + 1) * 2 * KV70 * 128 * 2
    act_layer = 20 * 2 * H70 * 2
    gpu_bytes = 40 * (LAYER70 * bpw + kv_layer + act_layer)
    cpu_bytes = 40 * (LAYER70 * bpw + kv_layer + act_layer) + V70 * H70 * bpw
    gpu_s = gpu_bytes / (1.008e12 * fg.bw_eff) + 40 * 20 * fg.kernel_s
    cpu_s = cpu_bytes / (89.6e9 * fc.bw_eff) + 40 * 20 * fc.kernel_s
    cost = step_cost(pl, BatchShape(decode=(ctx,)))
    assert pl.n_gpu_layers == 40
    assert cost.seconds == pytest.approx(gpu_s + cpu_s, rel=0.01)
    tiers = dict(cost.bytes_by_tier)
    assert tiers["vram"] == pytest.approx(gpu_bytes, rel=0.01)
    assert tiers["host_dram"] == pytest.approx(cpu_bytes, rel=0.01)
    assert cpu_s > 5 * gpu_s  # the CPU tier dominates: ratio of the tiers' bandwidths


def test_offloaded_prefill_is_bounded_by_pcie():
    """A step of ≥ 32 tokens copies the CPU layers' weights over PCIe to the GPU."""
    pl = place(DeploymentSpec("llama-3.1-70b", "q4_k_m", "rtx-4090", "llama.cpp",
                              n_gpu_layers=40))
    cpu_weights = (40 * LAYER70 + V70 * H70) * 0.605
    small = step_cost(pl, BatchShape(prefill=((31, 0),)))
    big = step_cost(pl, BatchShape(prefill=((512, 0),)))
    assert big.seconds >= cpu_weights / 31.5e9
    assert big.seconds < small.seconds * 512 / 31 / 4  # batching pays off


def test_tensor_parallel_all_reduce():
    """Two all-reduces per layer; NCCL's latency model (base 3.6 µs + 0.47 µs per ring step,
    2(n−1) steps) plus the ring transfer 2(n−1)/n of the message over 450 GB/s."""
    pl = place(DeploymentSpec("llama-3.1-70b", "bf16", "h100-sxm", "vllm", count=4))
    assert (pl.tp, pl.pp, pl.chips) == (4, 1, 4)
    cost = step_cost(pl, BatchShape(decode=(10,) * 8))
    latency = 3.6e-6 + 2 * 3 * 0.47e-6
    per = latency + 2 * 3 / 4 * 8 * H70 * 2 / 450e9  # latency + ring transfer of 8 tokens
    assert cost.link_s == pytest.approx(2 * L70 * per, rel=0.01)


def test_pipeline_latency_sums_stages_and_interval_is_slowest():
    pl = place(DeploymentSpec("llama-3.1-70b", "bf16", "cerebras-cs3", "cerebras"))
    cost = step_cost(pl, BatchShape(decode=(100,)))
    (stage,) = cost.stage_seconds
    hop = 10e-6 + H70 * 2 / 150e9
    assert pl.chips == pl.pp == 4
    assert cost.seconds == pytest.approx(4 * stage + 3 * hop, rel=0.01)
    assert cost.interval_s == pytest.approx(stage + hop, rel=0.01)


def test_moe_weight_bytes_grow_with_experts_touched():
    pl = place(DeploymentSpec("mixtral-8x7b", "bf16", "h100-sxm", "vllm", count=2))
    m = pl.model
    experts = m.n_layers * m.mlp_params_per_layer * 2

    def weight_bytes(t: int) -> float:
        cost = step_cost(pl, BatchShape(decode=(0,) * t))
        kv_act = sum(s.kv_bytes_per_token + s.act_bytes_per_token
                     for st in pl.plan.stages for s in st.segments) * 2 * 2 * t
        return cost.bytes - kv_act

    for t in (1, 4, 64):
        touched = 1 - (1 - 2 / 8) ** t  # E·(1 − (1 − k/E)^T) / E
        dense = (m.n_layers * m.attn_params_per_layer + m.head_params) * 2
        assert weight_bytes(t) == pytest.approx(dense + experts * touched, rel=0.01)


def test_tpu_pads_tokens_to_the_mxu():
    pl = place(DeploymentSpec("llama-3.1-8b", "bf16", "tpu-v5e", "jetstream", count=8))
    one = step_cost(pl, BatchShape(decode=(0,)))
    full = step_cost(pl, BatchShape(decode=(0,) * 128))
    # 1 row costs a 128-row pass through the linear layers (only logits/attention differ)
    assert one.flops > 0.9 * full.flops


def test_energy_and_dollars():
    pl = place(DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm"))
    cost = step_cost(pl, BatchShape(decode=(100,)))
    assert cost.joules == pytest.approx(700 * cost.seconds, rel=1e-6)  # busy the whole step
    assert cost.dollars == pytest.approx(pl.chip.usd_per_hour / 3600 * cost.seconds)


def test_empty_batch_costs_nothing():
    pl = place(DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm"))
    assert step_cost(pl, BatchShape()).seconds == 0.0
