"""The KV element vLLM gives a checkpoint under `--kv-cache-dtype auto` (vLLM 0.33.0
resolve_kv_cache_dtype_string): FP8 only when the checkpoint declares an FP8 KV-cache scheme,
else the model's 16-bit dtype — so DeepSeek's and Qwen's block-scaled FP8 releases hold half
the tokens an FP8 KV cache would, and NVIDIA's ModelOpt FP8 checkpoint keeps its FP8 cache."""

from __future__ import annotations

import json

import pytest
from fleets import vllm_pod_options as pod

from devices import place
from devices.hf_config import checkpoint_kv_cache_dtype


@pytest.mark.parametrize("repo, declared", [
    ("nvidia/Llama-3.1-8B-Instruct-FP8", "fp8"),  # hf_quant_config: kv_cache_quant_algo FP8
    ("deepseek-ai/DeepSeek-R1", "auto"),  # quant_method fp8, 128 × 128 blocks, no KV scheme
    ("Qwen/Qwen3-32B-FP8", "auto"),
    ("meta-llama/Llama-3.1-8B-Instruct", "auto"),
    ("llama-3.1-8b", None),  # a catalogue model, not a checkpoint
])
def test_what_each_checkpoint_declares(repo, declared):
    assert checkpoint_kv_cache_dtype(repo) == declared


def test_a_block_fp8_checkpoint_keeps_a_16_bit_kv_cache_unless_told():
    auto, fp8 = pod("Qwen/Qwen3-32B-FP8", "-tp", "2"), pod("Qwen/Qwen3-32B-FP8", "-tp", "2",
                                                        "--kv-cache-dtype", "fp8")
    assert (auto.cache_dtype, fp8.cache_dtype) == ("auto", "fp8")
    assert auto.spec().kv_cache_dtype == "bf16" and auto.quant == "fp8"
    tokens, fp8_tokens = place(auto.spec()).kv_tokens, place(fp8.spec()).kv_tokens
    assert fp8_tokens == pytest.approx(2 * tokens, rel=1e-4)


def test_a_checkpoint_that_declares_fp8_kv_gets_it_and_says_so():
    d = pod("nvidia/Llama-3.1-8B-Instruct-FP8")
    assert d.cache_dtype == "fp8" and d.spec().kv_cache_dtype == "fp8"


@pytest.mark.parametrize("files, declared", [
    ({"config.json": {"quant_method": "fp8"}}, "auto"),
    ({"config.json": {"quant_method": "compressed-tensors",
                      "kv_cache_scheme": {"num_bits": 8, "type": "float"}}}, "fp8"),
    ({"config.json": {"quant_method": "modelopt"},
      "hf_quant_config.json": {"quantization": {"quant_algo": "FP8",
                                                "kv_cache_quant_algo": "FP8"}}}, "fp8"),
], ids=["fp8-blocks", "llm-compressor", "modelopt"])
def test_a_local_checkpoint_folder_says_it_in_its_quantization_config(tmp_path, files, declared):
    for name, doc in files.items():
        body = {"quantization_config": doc} if name == "config.json" else doc
        (tmp_path / name).write_text(json.dumps(body))
    assert checkpoint_kv_cache_dtype(str(tmp_path)) == declared
