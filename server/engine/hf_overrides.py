"""vLLM's `--hf-overrides`: config.json keys a deployment overrides (a JSON object).

Emulated are the keys that make an embedding model Matryoshka, which vLLM's
`ModelConfig.is_matryoshka` reads (config/model.py: a non-empty `matryoshka_dimensions`, or
`is_matryoshka`): with them a request's `dimensions` is accepted (within the listed
dimensions, when listed). vLLM's docs give `--hf-overrides '{"is_matryoshka": true}'` for
models whose card describes MRL but whose config.json does not declare it (Qwen3-Embedding).
Other keys change nothing here (`vllm serve` warns that they are not emulated).
"""

from __future__ import annotations

import json
from typing import Any

EMULATED = ("is_matryoshka", "matryoshka_dimensions")


def parse(text: str | None) -> dict[str, Any]:
    """The overrides as a dict ({} when none); ValueError naming the flag when not an object,
    or when an emulated key has the wrong type."""
    if not text:
        return {}
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"--hf-overrides: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError("--hf-overrides: a JSON object of config.json keys")
    dims = doc.get("matryoshka_dimensions")
    if dims is not None and not (isinstance(dims, list) and all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims)):
        raise ValueError("--hf-overrides: matryoshka_dimensions is a list of positive ints")
    if not isinstance(doc.get("is_matryoshka", False), bool):
        raise ValueError("--hf-overrides: is_matryoshka is true or false")
    return doc


def matryoshka(text: str | None, declared: bool) -> tuple[bool, tuple[int, ...]]:
    """(whether `dimensions` may be asked, the dimensions allowed — () for any), given what
    the model's own config.json `declared`."""
    doc = parse(text)
    dims = tuple(doc.get("matryoshka_dimensions") or ())
    return bool(dims) or bool(doc.get("is_matryoshka", declared)), dims
