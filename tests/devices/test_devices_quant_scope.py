"""Which weights a format quantises (quants.toml ``scope``): FP8, NVFP4 and int4 checkpoints
quantise the decoder layers and leave the embedding and LM head in 16 bit; gpt-oss's MXFP4
quantises only the routed experts; GGUF and MLX files quantise everything. Checked by what
moves between a 16-bit placement and a quantised one of the same model."""

from __future__ import annotations

import pytest

from devices import DeploymentSpec, catalog, place
from devices.placed import read_bytes, resident_bytes


def _saved(model_id: str, quant_id: str) -> float:
    """Bytes the format saves over bf16 on the whole checkpoint."""
    model = catalog.get_model(model_id)
    return (resident_bytes(model, catalog.get_quant("bf16"))
            - resident_bytes(model, catalog.get_quant(quant_id)))


@pytest.mark.parametrize("quant", ["fp8", "nvfp4", "awq-int4"])
def test_layer_formats_shrink_the_layers_and_keep_embedding_and_head_16_bit(quant):
    model = catalog.get_model("llama-3.1-70b")
    bpw = catalog.get_quant(quant).bytes_per_weight
    layers = model.n_layers * model.layer_params
    assert _saved(model.id, quant) == pytest.approx(layers * (2 - bpw), rel=1e-12)


def test_mxfp4_shrinks_only_the_experts():
    model = catalog.get_model("gpt-oss-20b")
    experts = model.n_layers * model.mlp_params_per_layer
    assert 0.8 < experts / model.params < 0.95  # most of gpt-oss, not all of it
    assert _saved(model.id, "mxfp4") == pytest.approx(experts * (2 - 0.53125), rel=1e-12)


def test_gguf_quantises_every_weight():
    model = catalog.get_model("llama-3.1-8b")
    assert _saved(model.id, "q8_0") == pytest.approx(model.params * (2 - 1.0625), rel=1e-6)


def test_a_decode_step_reads_the_16_bit_head_of_an_fp8_checkpoint():
    """The LM head is read every step: in 16 bit from an FP8 checkpoint, at 1 byte from a
    GGUF q8_0 one (their layers weigh within 6 % of each other)."""
    model = catalog.get_model("llama-3.1-8b")
    head = model.head_params
    fp8, q8 = catalog.get_quant("fp8"), catalog.get_quant("q8_0")
    assert (read_bytes(model, fp8, 0, 1.0), read_bytes(model, q8, 0, 1.0)) == (2 * head,
                                                                                1.0625 * head)


def test_placed_weights_follow_the_scope():
    """70B FP8 over two H100s holds half of 1 byte per layer weight plus 2 bytes per
    embedding and head weight on each chip (vLLM logged 33.88 GiB; docs/FIDELITY.md)."""
    model = catalog.get_model("llama-3.1-70b")
    pl = place(DeploymentSpec("llama-3.1-70b", "fp8", "h100-sxm", "vllm", count=2))
    per_chip = dict(pl.weight_bytes)["hbm"] / 2
    want = (model.n_layers * model.layer_params + 2 * 2 * model.embed_params) / 2
    assert per_chip == pytest.approx(want, rel=1e-9)
