"""The design notes' claims, checked on estimate/placement outputs (nothing is written in).

Where a claim rests on an assumption rather than a published figure (MLX kernel efficiency,
Cerebras' dense FLOPs, idle power) only its direction is checked.
"""

from __future__ import annotations

import pytest

from devices import DeploymentSpec, PlacementError, estimate, place


def est(spec: DeploymentSpec, prompt: int = 512, output: int = 128, batch: int = 1) -> dict:
    result = estimate(spec, prompt, output, batch)
    assert result["fits"], result
    return result


def decode(spec: DeploymentSpec) -> float:
    return est(spec)["decode_tokens_per_s"]


def test_llamacpp_partial_offload_between_full_gpu_and_cpu_only():
    def spec(ngl: int | None) -> DeploymentSpec:
        return DeploymentSpec("llama-3.1-8b", "f16", "rtx-4090", "llama.cpp", n_gpu_layers=ngl)

    full, partial, cpu = decode(spec(None)), decode(spec(16)), decode(spec(0))
    assert place(spec(None)).n_gpu_layers == 33  # everything fits: 32 layers + output
    assert full > partial > cpu
    # slower by roughly the ratio of the tiers' bandwidths (VRAM 1,008 vs DDR5 89.6 GB/s)
    assert full / cpu > 5


def test_llamacpp_big_model_runs_and_spilling_to_ssd_is_far_slower():
    in_ram = DeploymentSpec("llama-3.1-70b", "q4_k_m", "rtx-4090", "llama.cpp")
    spilled = DeploymentSpec("llama-3.1-70b", "f16", "rtx-4090", "llama.cpp")
    pr, ps = place(in_ram), place(spilled)
    assert 0 < pr.n_gpu_layers < 80 and "ssd" not in dict(pr.weight_bytes)
    assert dict(ps.weight_bytes).get("ssd", 0) > 0
    # effective bytes per second of weights: the SSD tier drags it down by an order of magnitude
    eff_ram = sum(b for _, b in pr.weight_bytes) * decode(in_ram)
    eff_ssd = sum(b for _, b in ps.weight_bytes) * decode(spilled)
    assert eff_ssd < eff_ram / 5


def test_mlx_vs_llamacpp_on_the_same_apple_chip():
    ratios = {}
    for model in ("llama-2-7b", "llama-2-70b"):
        mlx = est(DeploymentSpec(model, "mlx-4bit", "m2-ultra-60", "mlx"))
        cpp = est(DeploymentSpec(model, "q4_0", "m2-ultra-60", "llama.cpp"))
        assert mlx["decode_tokens_per_s"] > cpp["decode_tokens_per_s"]  # decode faster
        assert mlx["prefill_tokens_per_s"] < cpp["prefill_tokens_per_s"]  # prompt slower
        ratios[model] = mlx["decode_tokens_per_s"] / cpp["decode_tokens_per_s"]
    assert ratios["llama-2-70b"] < ratios["llama-2-7b"]  # both bandwidth-bound: gap narrows


def test_mlx_model_larger_than_unified_memory_fails_clearly():
    spec = DeploymentSpec("llama-3.1-70b", "f16", "m4-max-40", "mlx")
    with pytest.raises(PlacementError, match="unified memory") as err:
        place(spec)
    assert "swap" in str(err.value)
    result = estimate(spec, 512, 128)
    assert result["fits"] is False and "unified memory" in result["error"]


@pytest.mark.parametrize(("model", "quant"), [("llama-2-70b", "f16"), ("llama-3.1-70b", "bf16")])
def test_70b_on_groq_lpu_v1_needs_hundreds_of_chips(model: str, quant: str):
    chips = place(DeploymentSpec(model, quant, "groq-lpu-v1", "groq")).chips
    assert 300 <= chips < 1000


def test_cerebras_8b_on_one_system_70b_on_several():
    assert place(DeploymentSpec("llama-3.1-8b", "bf16", "cerebras-cs3", "cerebras")).chips == 1
    big = place(DeploymentSpec("llama-3.1-70b", "bf16", "cerebras-cs3", "cerebras")).chips
    assert 2 <= big <= 8


H100 = {"llama-3.1-8b": 1, "llama-3.1-70b": 4}


@pytest.mark.parametrize("model", list(H100))
def test_batch1_decode_several_times_faster_on_sram_chips(model: str):
    h100 = decode(DeploymentSpec(model, "bf16", "h100-sxm", "vllm", count=H100[model]))
    for chip, engine in (("groq-lpu-v1", "groq"), ("cerebras-cs3", "cerebras")):
        assert decode(DeploymentSpec(model, "bf16", chip, engine)) > 3 * h100, chip


def _usd_at_large_batch(spec: DeploymentSpec, batch: int = 256) -> float:
    """$/Mtok at `batch`: an SRAM deployment without a count is sized for the batch by
    estimate; an HBM one runs as many sequences as its KV holds."""
    if spec.chip in ("groq-lpu-v1", "cerebras-cs3"):
        return est(spec, 512, 512, batch)["usd_per_mtok"]
    b = min(batch, place(spec).max_concurrency(1024))
    return est(spec, 512, 512, b)["usd_per_mtok"]


@pytest.mark.parametrize("model", list(H100))
def test_h100_has_lowest_dollars_per_mtok_at_large_batch(model: str):
    n = H100[model]
    h100 = min(
        _usd_at_large_batch(DeploymentSpec(model, "bf16", "h100-sxm", "vllm", count=n)),
        _usd_at_large_batch(DeploymentSpec(model, "fp8", "h100-sxm", "tensorrt-llm", count=n)),
    )
    for chip, engine in (("groq-lpu-v1", "groq"), ("cerebras-cs3", "cerebras")):
        assert h100 < _usd_at_large_batch(DeploymentSpec(model, "bf16", chip, engine)), chip


def test_sram_deployments_are_sized_for_the_batch():
    """issue 17's example: Groq, Llama 3.1 70B FP8, batch 256 of 512 + 512 tokens answers
    (it used to fail with 'exceeds KV capacity'): the chip count grows to hold the KV."""
    spec = DeploymentSpec("llama-3.1-70b", "fp8", "groq-lpu-v1", "groq")
    one, many = est(spec, 512, 512, 1), est(spec, 512, 512, 256)
    assert many["usd_per_mtok"] > 0 and many["chips"] > one["chips"]
    kv = 256 * 1024 * 80 * 2 * 8 * 128 * 1.0  # sequences × tokens × K,V per layer (FP8 KV)
    assert (many["chips"] - one["chips"]) * 241172480 == pytest.approx(kv, rel=0.05)


def test_large_batch_amortises_the_weight_read_on_hbm():
    spec = DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm")
    one, many = est(spec), est(spec, batch=64)
    assert many["output_tokens_per_s"] > 20 * one["output_tokens_per_s"]
    assert many["usd_per_mtok"] < one["usd_per_mtok"] / 20


def test_tensorrt_engine_built_for_one_architecture_refuses_another():
    ok = DeploymentSpec("llama-3.1-8b", "fp8", "h100-sxm", "tensorrt-llm", built_for="hopper")
    assert place(ok).chips == 1
    bad = DeploymentSpec("llama-3.1-8b", "fp8", "a100-sxm-80g", "tensorrt-llm",
                         built_for="hopper")
    with pytest.raises(PlacementError, match="rebuild"):
        place(bad)


def test_sram_chips_are_overhead_or_link_bound_not_flops():
    result = est(DeploymentSpec("llama-3.1-8b", "bf16", "cerebras-cs3", "cerebras"))
    assert result["bound"] == "overhead"  # 16 GB ÷ 21 PB/s ≈ 1 µs; the fixed cost dominates
