"""A Hugging Face `config.json` read against the catalogue: the model with its figures and the
weight format of its weights. Why it exists: `vllm serve /models/NAME` names a local
checkpoint by path (a mounted volume); what vLLM would load is what its config.json says.

The figures compared are the ones every catalogue model records from its own config.json:
layers, hidden size, attention and KV heads, vocabulary and context length (a model's
`text_config` for multimodal checkpoints). The weight format is `quantization_config`'s
`quant_method` (as vLLM's `--quantization` names it), else `torch_dtype` (`dtype` in newer
transformers): float16 is f16, bfloat16 bf16, and float32 bf16 (vLLM's `--dtype auto` casts
32-bit weights to 16 bits on a GPU), or f16 for a pooling model (vLLM's preference for them).
An encoder's config.json gives its learned positions, which may outnumber its context
(`catalogue_figures`); an encoder and the classifier fine-tuned from it share every figure,
and `architectures` (`*ForSequenceClassification`) tells them apart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from devices import catalog
from devices.errors import DeviceError, UnknownId
from devices.model import ModelSpec

FIGURES = (("n_layers", "num_hidden_layers"), ("hidden", "hidden_size"),
           ("n_heads", "num_attention_heads"), ("n_kv_heads", "num_key_value_heads"),
           ("vocab", "vocab_size"), ("max_context", "max_position_embeddings"))
DTYPES = {"float16": "f16", "bfloat16": "bf16", "float32": "bf16"}
CLASSIFIER_SUFFIXES = ("ForSequenceClassification", "ClassificationModel")


class ConfigMismatch(DeviceError, ValueError):
    """A config.json the catalogue cannot serve: no model with its figures, or an unknown
    weight format."""


def read_config(path: str | Path) -> dict[str, Any]:
    """`path`'s config.json (a checkpoint folder), or `path` itself (a .json file)."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    try:
        doc = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ConfigMismatch(f"cannot read {file}: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigMismatch(f"{file}: not a config.json (a JSON object)")
    return doc


def figures(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    merged = {**config, **text}
    out = {ours: merged.get(theirs) for ours, theirs in FIGURES}
    if out["n_kv_heads"] is None:  # transformers' default: no grouping
        out["n_kv_heads"] = out["n_heads"]
    return out


def catalogue_figures(model: ModelSpec) -> dict[str, Any]:
    """What `model`'s config.json says for each compared figure (an encoder's learned
    positions may outnumber its context: RoBERTa's start after the padding index)."""
    out = {ours: getattr(model, ours) for ours, _ in FIGURES}
    out["max_context"] = model.max_position_embeddings or model.max_context
    return out


def classifies(architectures: Any) -> bool:
    """Whether a config.json's `architectures` (as published, or as `--hf-overrides` names
    them) is a sequence classifier (a cross-encoder's head): vLLM's `_SUFFIX_TO_DEFAULTS`
    (config/model.py) serves those suffixes as classifiers."""
    return any(str(a).endswith(CLASSIFIER_SUFFIXES) for a in architectures or ())


def model_for(config: dict[str, Any]) -> ModelSpec:
    """The catalogue model whose figures are `config`'s; where an encoder and the classifier
    fine-tuned from it share them, its `architectures` tells which."""
    want = figures(config)
    found = [m for m in catalog.list_models() if catalogue_figures(m) == want]
    if len(found) > 1:
        classifier = classifies(config.get("architectures"))
        found = [m for m in found if (m.pooling_task == "classify") == classifier]
    if len(found) != 1:
        shown = ", ".join(f"{theirs} {want[ours]}" for ours, theirs in FIGURES)
        raise ConfigMismatch(f"no catalogue model has this config.json's figures ({shown}); "
                             f"known: {', '.join(m.id for m in catalog.list_models())}")
    return found[0]


def quant_for(config: dict[str, Any], pooling: bool = False) -> str:
    """The weight format `config`'s checkpoint is served in: a pooling model's float32 weights
    in float16 (vLLM 0.33.0 `_resolve_auto_dtype` prefers float16 for pooling models)."""
    qc = config.get("quantization_config")
    if isinstance(qc, dict) and qc.get("quant_method"):
        try:
            return catalog.quant_for_vllm(str(qc["quant_method"])).id
        except UnknownId as e:
            raise ConfigMismatch(f"quantization_config: {e}") from None
    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    if dtype not in DTYPES:
        raise ConfigMismatch(f"torch_dtype {dtype!r}: known are {', '.join(DTYPES)}")
    return "f16" if pooling and dtype == "float32" else DTYPES[dtype]


def checkpoint_kv_cache_dtype(name: str) -> str | None:
    """What vLLM resolves `--kv-cache-dtype auto` to for the checkpoint `name` (a local folder
    or a catalogue repository id): 'fp8' when it declares an FP8 KV-cache scheme (ModelOpt's
    `kv_cache_quant_algo`, in config.json's quantization_config or hf_quant_config.json;
    llm-compressor's `kv_cache_scheme`), else 'auto' — the model's 16-bit dtype, whatever
    its weights' format. None when `name` is neither (a catalogue model id)."""
    path = Path(name)
    if path.exists():
        qc = read_config(name).get("quantization_config")
        declared = isinstance(qc, dict) and (qc.get("kv_cache_quant_algo")
                                             or qc.get("kv_cache_scheme"))
        modelopt = path / "hf_quant_config.json" if path.is_dir() else None
        if not declared and modelopt is not None and modelopt.exists():
            try:
                quant = json.loads(modelopt.read_text()).get("quantization", {})
            except ValueError as e:
                raise ConfigMismatch(f"cannot read {modelopt}: {e}") from None
            declared = isinstance(quant, dict) and quant.get("kv_cache_quant_algo")
        return "fp8" if declared else "auto"
    try:
        return catalog.get_checkpoint(name).kv_cache_dtype
    except UnknownId:
        return None
