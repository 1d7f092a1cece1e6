"""Placement: the default fleet places, errors are clear, functions are pure."""

from __future__ import annotations

import dataclasses

import pytest

from devices import (
    BatchShape,
    DeploymentSpec,
    PlacementError,
    UnknownId,
    catalog,
    place,
    step_cost,
)
from devices.errors import DeviceError

FLEET = [
    DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm"),
    DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "sglang"),
    DeploymentSpec("llama-3.1-8b", "fp8", "h100-sxm", "tensorrt-llm", built_for="hopper"),
    DeploymentSpec("llama-3.1-70b", "q4_k_m", "rtx-4090", "llama.cpp"),
    DeploymentSpec("llama-3.1-8b", "mlx-4bit", "m4-max-40", "mlx"),
    DeploymentSpec("llama-3.1-8b", "bf16", "tpu-v5e", "jetstream", count=8),
    DeploymentSpec("llama-2-70b", "f16", "groq-lpu-v1", "groq"),
    DeploymentSpec("llama-3.1-70b", "bf16", "groq-lpu-v1", "groq"),
    DeploymentSpec("llama-3.1-8b", "bf16", "cerebras-cs3", "cerebras"),
]


@pytest.mark.parametrize("spec", FLEET, ids=lambda s: f"{s.engine}-{s.chip}-{s.model}")
def test_default_fleet_deployments_place(spec: DeploymentSpec):
    pl = place(spec)
    assert pl.chips >= 1 and pl.kv_blocks() > 0 and pl.max_context >= 2048
    assert pl.max_concurrency(1024) >= 1
    cost = step_cost(pl, BatchShape(prefill=((100, 0),), decode=(500, 900)))
    assert cost.seconds > 0 and cost.joules > 0 and cost.dollars > 0


def test_llamacpp_default_offload_keeps_as_many_layers_as_fit():
    pl = place(FLEET[3])
    assert 30 < pl.n_gpu_layers < 80
    tiers = dict(pl.weight_bytes)
    vram = catalog.get_chip("rtx-4090").tier.capacity_bytes  # 24,564 MiB reported
    assert tiers["vram"] <= vram and tiers["host_dram"] > 0


def test_llamacpp_too_many_gpu_layers_is_refused():
    spec = DeploymentSpec("llama-3.1-70b", "q4_k_m", "rtx-4090", "llama.cpp", n_gpu_layers=80)
    with pytest.raises(PlacementError, match="n_gpu_layers"):
        place(spec)


def test_jetstream_shards_over_the_slice():
    pl = place(FLEET[5])
    assert (pl.tp, pl.pp, pl.chips) == (8, 1, 8)


def test_kv_blocks_and_capacity_h100():
    pl = place(FLEET[0])
    kv_per_token = 2 * 32 * 8 * 128 * 2
    assert pl.kv_blocks(16) == pl.kv_tokens // 16
    # 0.92 (vLLM 0.33.0's default) of the 81,559 MiB an H100 reports − 16.06 GB of weights −
    # activations (under 2 GB), in 128 KiB tokens
    usable = 0.92 * 81559 * 2**20 - 16.06e9
    assert (usable - 2e9) / kv_per_token < pl.kv_tokens < usable / kv_per_token
    assert pl.max_context == 131072


def test_groq_count_given_too_small_is_refused():
    with pytest.raises(PlacementError, match="at least"):
        place(DeploymentSpec("llama-2-70b", "f16", "groq-lpu-v1", "groq", count=100))


def test_gpu_model_too_big_for_one_chip():
    with pytest.raises(PlacementError, match="does not fit"):
        place(DeploymentSpec("llama-3.1-70b", "bf16", "h100-sxm", "vllm"))
    assert place(DeploymentSpec("llama-3.1-70b", "bf16", "h100-sxm", "vllm", count=4)).tp == 4


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "mlx"), "apple"),
        (DeploymentSpec("llama-3.1-8b", "bf16", "m4-max-40", "tensorrt-llm"), "nvidia"),
        (DeploymentSpec("llama-3.1-8b", "q4_0", "h100-sxm", "vllm"), "does not load"),
        (DeploymentSpec("llama-3.1-8b", "bf16", "m4-max-40", "mlx", count=2), "link"),
        (DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm", count=4, tp=3), "tp"),
    ],
)
def test_clear_placement_errors(spec: DeploymentSpec, message: str):
    with pytest.raises(PlacementError, match=message):
        place(spec)


def test_unknown_ids_raise_typed_errors():
    for getter, kind in ((catalog.get_chip, "chip"), (catalog.get_engine, "engine"),
                         (catalog.get_model, "model"), (catalog.get_quant, "quantisation")):
        with pytest.raises(UnknownId, match=f"unknown {kind}") as err:
            getter("nope")
        assert isinstance(err.value, DeviceError) and err.value.known
    with pytest.raises(UnknownId):
        place(DeploymentSpec("llama-9", "bf16", "h100-sxm", "vllm"))


def test_place_and_step_cost_are_pure():
    a, b = place(FLEET[3]), place(FLEET[3])
    assert a == b
    batch = BatchShape(prefill=((64, 0),), decode=(10, 20))
    assert step_cost(a, batch) == step_cost(b, batch) == step_cost(a, batch)


def test_memory_bytes_per_tier():
    pl = place(FLEET[4])
    mem = pl.memory_bytes(1000)
    assert set(mem) == {"unified"}
    assert mem["unified"] == pytest.approx(8.03e9 * 0.5625 + 1000 * 131072, rel=0.01)


def test_tensor_parallelism_must_divide_the_heads_where_the_engine_shards_them(monkeypatch):
    """vLLM, SGLang, TensorRT-LLM and JetStream (JAX shards an array's heads axis evenly
    only) split attention heads over TP ranks (the catalogue's `tp_divides_heads`): Llama 3.1
    8B's 32 heads take TP 1, 2, 4, 8 … not 3 or 6; an engine without the trait (llama.cpp's
    row split, were it placed over GPUs here) would place TP 3: the trait decides, not the
    engine's name."""
    for engine, chip in (("vllm", "h100-sxm"), ("sglang", "h100-sxm"), ("jetstream", "tpu-v5e")):
        with pytest.raises(PlacementError, match=r"heads \(32\) must be divisible by tensor "
                                                 r"parallel size \(3\)"):
            place(DeploymentSpec("llama-3.1-8b", "bf16", chip, engine, tp=3))
        assert place(DeploymentSpec("llama-3.1-8b", "bf16", chip, engine, tp=4)).chips == 4
    get_engine, vllm = catalog.get_engine, catalog.get_engine("vllm")
    monkeypatch.setattr(catalog, "get_engine", lambda name: dataclasses.replace(
        vllm, tp_divides_heads=False) if name == "vllm" else get_engine(name))
    assert place(DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm", tp=3)).chips == 3


def test_a_max_model_len_past_the_models_context_is_refused_as_vllm_refuses_it():
    """vLLM's ModelConfig refuses a max_model_len above max_position_embeddings (positions
    past the trained context are NaN under RoPE); on every engine, SRAM chips too."""
    for chip, engine in (("h100-sxm", "vllm"), ("groq-lpu-v1", "groq")):
        with pytest.raises(PlacementError, match=r"User-specified max_model_len \(262144\) is "
                                                 r"greater than the derived max_model_len "
                                                 r"\(max_position_embeddings=131072"):
            place(DeploymentSpec("llama-3.1-8b", "bf16", chip, engine, max_context=262144))
    assert place(DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm",
                                max_context=131072)).max_context == 131072
