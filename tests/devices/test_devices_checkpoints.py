"""Hugging Face checkpoints in the catalogue (`checkpoints.toml`), vLLM's quantisation method
names (`quants.toml`), and the two vLLM engine knobs a `vllm serve` command line carries into
the device layer: `--gpu-memory-utilization` (memory the engine may use) and
`--enforce-eager` (no captured graphs: the host launches every kernel)."""

from __future__ import annotations

import pytest

from devices import BatchShape, DeploymentSpec, catalog, place, step_cost
from devices.errors import PlacementError, UnknownId


@pytest.mark.parametrize("ckpt", catalog.list_checkpoints(), ids=lambda c: c.repo)
def test_every_checkpoint_is_a_catalogue_model_vllm_loads(ckpt):
    """Each names a catalogue model and a weight format the vLLM profile loads, with a
    source, and places somewhere: on one H100 or B200, or over the chips of one 8-GPU box."""
    model, quant = catalog.get_model(ckpt.model), catalog.get_quant(ckpt.quant)
    assert quant.family in catalog.get_engine("vllm").quant_families
    assert ckpt.source and "/" in ckpt.repo
    assert model.source.split()[0].split("/")[0].lower() == ckpt.repo.split("/")[0].lower() \
        or ckpt.repo.startswith("nvidia/")  # NVIDIA republishes Meta's model quantised
    placed = []
    for chip in ("h100-sxm", "b200"):
        for tp in (1, 8):
            try:
                place(DeploymentSpec(model=ckpt.model, quant=ckpt.quant, chip=chip,
                                     engine="vllm", tp=tp))
                placed.append((chip, tp))
            except PlacementError as e:  # too big for these chips: try more
                assert "does not fit" in str(e) or "divisible" in str(e), e
    assert placed, ckpt.repo


def test_checkpoint_ids_match_case_insensitively_and_unknown_ones_list_the_known():
    assert catalog.get_checkpoint("META-LLAMA/llama-3.1-8b-INSTRUCT").model == "llama-3.1-8b"
    with pytest.raises(UnknownId) as err:
        catalog.get_checkpoint("org/none")
    assert "meta-llama/Llama-3.1-8B-Instruct" in str(err.value)


def test_each_vllm_quantization_method_names_one_format():
    names = [m for q in catalog.list_quants() for m in q.vllm_quantization]
    assert len(names) == len(set(names))
    assert catalog.quant_for_vllm("gptq_marlin").id == "gptq-int4"
    with pytest.raises(UnknownId):
        catalog.quant_for_vllm("bitsandbytes")


def _spec(**kw) -> DeploymentSpec:
    return DeploymentSpec(**{"model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
                             "engine": "vllm", **kw})


def test_gpu_memory_utilization_takes_memory_from_the_kv_cache_only():
    """Weights and activations stay; the KV cache loses exactly the memory given up."""
    full, half = place(_spec()), place(_spec(gpu_mem_utilisation=0.5))
    assert half.weight_bytes == full.weight_bytes
    hbm = catalog.get_chip("h100-sxm").tier.capacity_bytes
    per_token = full.memory_bytes(1)["hbm"] - full.memory_bytes(0)["hbm"]
    assert per_token == 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, bf16
    lost = full.kv_tokens - half.kv_tokens
    assert abs(lost * per_token - (full.memory_share - 0.5) * hbm) <= per_token
    with pytest.raises(PlacementError, match="does not fit"):
        place(_spec(gpu_mem_utilisation=0.1))  # 8 GB: not even the weights


def test_enforce_eager_costs_launches_only_where_the_host_cannot_keep_up():
    """Without graphs every kernel is launched by the host (the chip's launch time each): a
    step whose device work is shorter waits for the host, a longer one hides it."""
    small = dict(model="qwen3-30b-a3b", quant="fp8", chip="b200")  # ~2 ms MoE decode steps
    graph, eager = place(_spec(**small)), place(_spec(**small, enforce_eager=True))
    one, wide = BatchShape(decode=(512,)), BatchShape(decode=(512,) * 256)
    assert step_cost(eager, one).seconds > step_cost(graph, one).seconds * 1.05
    assert step_cost(eager, wide).seconds == pytest.approx(step_cost(graph, wide).seconds)
    for chip in ("h100-sxm", "mi300x", "b200"):  # never faster, on any chip
        g, e = place(_spec(chip=chip)), place(_spec(chip=chip, enforce_eager=True))
        assert step_cost(e, one).seconds >= step_cost(g, one).seconds
    # an engine without captured graphs (llama.cpp launches eagerly anyway) is unchanged
    cpp = dict(engine="llama.cpp", quant="q4_0", chip="rtx-4090", model="llama-2-7b")
    assert step_cost(place(_spec(**cpp, enforce_eager=True)), one).seconds \
        == step_cost(place(_spec(**cpp)), one).seconds
