"""A local checkpoint's config.json read against the catalogue (`devices.hf_config`), as
`vllm serve /models/NAME` names a mounted checkpoint: the model with its figures, the weight
format of its `quantization_config` or `torch_dtype`, and a clear refusal otherwise."""

from __future__ import annotations

import json

import pytest

from devices import catalog
from devices.hf_config import (
    ConfigMismatch,
    catalogue_figures,
    figures,
    model_for,
    quant_for,
    read_config,
)

# as published on the Hub (the fields compared, and some that are not)
LLAMA_31_8B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
               "intermediate_size": 14336, "max_position_embeddings": 131072,
               "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
               "rope_theta": 500000.0, "torch_dtype": "bfloat16", "vocab_size": 128256}
GPT_OSS_20B = {"architectures": ["GptOssForCausalLM"], "hidden_size": 2880,
               "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
               "vocab_size": 201088, "max_position_embeddings": 131072,
               "num_local_experts": 32, "quantization_config": {"quant_method": "mxfp4"}}
# BAAI/bge-m3 and BAAI/bge-reranker-v2-m3 (XLM-RoBERTa: 8,194 learned positions)
BGE_M3 = {"architectures": ["XLMRobertaModel"], "hidden_size": 1024, "intermediate_size": 4096,
          "max_position_embeddings": 8194, "num_attention_heads": 16, "num_hidden_layers": 24,
          "type_vocab_size": 1, "torch_dtype": "float32", "vocab_size": 250002}
GEMMA_3_27B = {"architectures": ["Gemma3ForConditionalGeneration"], "torch_dtype": "bfloat16",
               "text_config": {"hidden_size": 5376, "num_hidden_layers": 62,
                               "num_attention_heads": 32, "num_key_value_heads": 16,
                               "vocab_size": 262208, "max_position_embeddings": 131072}}


@pytest.mark.parametrize("config, model, quant", [
    (LLAMA_31_8B, "llama-3.1-8b", "bf16"),
    ({**LLAMA_31_8B, "max_position_embeddings": 8192}, "llama-3-8b", "bf16"),  # Llama 3
    ({**LLAMA_31_8B, "quantization_config": {"quant_method": "fp8"}}, "llama-3.1-8b", "fp8"),
    ({**LLAMA_31_8B, "torch_dtype": "float16"}, "llama-3.1-8b", "f16"),
    (GPT_OSS_20B, "gpt-oss-20b", "mxfp4"),
    (GEMMA_3_27B, "gemma-3-27b", "bf16"),  # a multimodal checkpoint's text_config
    (BGE_M3, "bge-m3", "f16"),  # float32, served in float16 as a pooling model
    ({**BGE_M3, "architectures": ["XLMRobertaForSequenceClassification"]},
     "bge-reranker-v2-m3", "f16"),
])
def test_a_config_names_its_model_and_weight_format(tmp_path, config, model, quant):
    (tmp_path / "config.json").write_text(json.dumps(config))
    read = read_config(tmp_path)  # the folder, as vLLM is given it
    served = model_for(read)
    assert (served.id, quant_for(read, served.is_pooling)) == (model, quant)


def test_no_two_catalogue_models_share_the_compared_figures():
    """Otherwise a config.json could not name one model."""
    seen = {}
    for m in catalog.list_models():  # (a classifier's architecture tells it from its encoder)
        key = (*catalogue_figures(m).values(), m.pooling_task == "classify")
        assert key not in seen, (m.id, seen.get(key))
        seen[key] = m.id


def test_what_cannot_be_served_says_why(tmp_path):
    with pytest.raises(ConfigMismatch, match="num_hidden_layers 30"):
        model_for({**LLAMA_31_8B, "num_hidden_layers": 30})
    with pytest.raises(ConfigMismatch, match="quantization_config: unknown vLLM quantization"):
        quant_for({**LLAMA_31_8B, "quantization_config": {"quant_method": "bitsandbytes"}})
    with pytest.raises(ConfigMismatch, match="torch_dtype 'int8'"):
        quant_for({**LLAMA_31_8B, "torch_dtype": "int8"})
    with pytest.raises(ConfigMismatch, match="cannot read"):
        read_config(tmp_path)  # no config.json there
    assert figures({"num_attention_heads": 16})["n_kv_heads"] == 16  # no grouping by default
