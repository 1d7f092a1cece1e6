"""Encoders (BERT, XLM-RoBERTa) on the devices: a BERT layer's parameters (biases, LayerNorm,
an MLP of two projections, learned positions), no KV cache in any memory tier, and attention
over the whole prompt both ways: a prompt of n tokens costs n² attention units, not causal
attention's n(n + 1)/2."""

from __future__ import annotations

import dataclasses

import pytest

from devices import BatchShape, DeploymentSpec, PlacementError, catalog, estimate, place
from devices.cost import plan_cost

BGE = DeploymentSpec("bge-m3", "f16", "h100-sxm", "vllm")


def test_a_bert_layer_is_counted_from_its_config_json():
    m = catalog.get_model("bge-m3")
    h, f = m.hidden, m.ffn
    attention = 4 * h * h + 4 * h  # q, k, v, o with their biases
    mlp = 2 * h * f + f + h  # up and down with biases, no gate
    norms = 2 * 2 * h  # two LayerNorms, a weight and a bias each
    embeddings = (m.vocab + m.max_position_embeddings + m.type_vocab_size) * h + 2 * h
    pooler = h * h + h
    assert m.params == m.n_layers * (attention + mlp + norms) + embeddings + pooler
    decoder = dataclasses.replace(m, gated_mlp=True, mlp_bias=False, norm_bias=False)
    assert decoder.dense_mlp_params == 3 * h * f  # the traits are what changes the count


def test_an_encoder_holds_no_kv_in_any_tier():
    placed = place(BGE)
    assert placed.model.kv_bytes_per_token(2) == 0 and placed.kv_tokens == 0
    assert placed.memory_bytes(100_000) == placed.memory_bytes(0)
    assert placed.max_context == placed.model.max_context == 8192
    groq = place(DeploymentSpec("bge-m3", "f16", "groq-lpu-v1", "groq"))
    assert groq.kv_tokens == 0 and groq.max_context == 8192  # SRAM sized by weights alone
    box = place(DeploymentSpec("bge-m3", "f16", "rtx-4090", "llama.cpp"))
    assert box.kv_tokens == 0 and box.max_context == 4096  # llama.cpp's n_ctx, no KV cache
    decoder = place(DeploymentSpec("qwen3-embedding-0.6b", "bf16", "h100-sxm", "vllm"))
    assert decoder.memory_bytes(100_000) != decoder.memory_bytes(0)
    # no KV bounds how many prompts run at once: the sequence cap does
    assert placed.max_concurrency(8192) == placed.spec.max_batch
    batch = estimate(BGE, prompt=8000, output=1, batch=placed.spec.max_batch)
    assert batch["max_concurrency"] == placed.spec.max_batch and "error" not in batch
    assert any("keeps no KV cache" in n for n in batch["notes"])


@pytest.mark.parametrize("n", [1, 64, 512, 3000])
def test_a_prompt_attends_to_itself_both_ways(n):
    plan = place(BGE).plan
    causal = dataclasses.replace(plan, bidirectional=False)
    shape = BatchShape(prefill=((n, 0),))
    both, one = plan_cost(plan, shape), plan_cost(causal, shape)
    m = catalog.get_model("bge-m3")
    extra = m.attn_flops_per_unit * m.n_layers * (n * n - n * (n + 1) / 2)
    assert both.flops - one.flops == pytest.approx(extra, rel=1e-9)
    assert both.seconds >= one.seconds


def test_an_encoder_that_does_not_fit_says_why():
    with pytest.raises(PlacementError, match=r"weights .* \+ activations .* per chip > 0.01 of"):
        place(DeploymentSpec("bge-m3", "f16", "rtx-4090", "vllm", gpu_mem_utilisation=0.01))
