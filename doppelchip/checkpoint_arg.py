"""The model argument of `doppelchip vllm serve` and `doppelchip sglang serve`: which catalogue
model and weight format a Hugging Face repository id, a local checkpoint folder or a catalogue
model id names, and how `--dtype` / `--quantization` change the weight format.

Why a module of its own: both engines' launch commands name their model the same ways (vLLM's
`vllm serve REPO`, SGLang's `--model-path REPO`), and one resolution keeps them serving the same
checkpoint alike (docs/VLLM_SERVE.md and docs/SGLANG_SERVE.md, "The model").
"""

from __future__ import annotations

import os
from collections.abc import Mapping

DTYPES = {"half": "f16", "float16": "f16", "bfloat16": "bf16"}  # --dtype -> quant (both engines)


def resolve_checkpoint(tag: str) -> tuple[str, str]:
    """(catalogue model id, weight format id) that `tag` names: a local folder (a mounted
    volume) by its config.json, else a catalogue checkpoint (devices/catalog/checkpoints.toml,
    case-insensitively), else a catalogue model id with bf16 weights. ValueError otherwise."""
    from devices import catalog
    from devices.errors import UnknownId

    if os.path.exists(tag):  # a local checkpoint: what its config.json says
        from devices.hf_config import model_for, quant_for, read_config

        config = read_config(tag)
        spec = model_for(config)
        return spec.id, quant_for(config, spec.is_pooling)
    try:
        ckpt = catalog.get_checkpoint(tag)
        return ckpt.model, ckpt.quant
    except UnknownId as e:
        if tag not in {m.id for m in catalog.list_models()}:
            raise ValueError(f"{e} (or a catalogue model: `doppelchip devices`; or a "
                             "local checkpoint folder with its config.json)") from None
        return tag, "bf16"  # a catalogue id: dtype auto on a bf16 checkpoint


def weight_format(quant: str, dtype: str | None, quantization: str | None,
                  aliases: Mapping[str, str] | None = None) -> str:
    """The weight format served: `--quantization METHOD` (vLLM's method names,
    devices/catalog/quants.toml `vllm_quantization`, or one of `aliases` naming such a method)
    wins; else a 16-bit `--dtype` recasts an unquantised checkpoint. ValueError for a 32-bit
    dtype or a method the catalogue has no format for."""
    from devices import catalog
    from devices.errors import UnknownId

    if dtype in ("float", "float32"):
        raise ValueError(f"--dtype {dtype}: the catalogue has no 32-bit weight format")
    if quantization:
        try:
            return catalog.quant_for_vllm((aliases or {}).get(quantization, quantization)).id
        except UnknownId as e:
            raise ValueError(f"--quantization: {e}") from None
    if dtype in DTYPES and catalog.get_quant(quant).family == "float":
        return DTYPES[dtype]
    return quant
