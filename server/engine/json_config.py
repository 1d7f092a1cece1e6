"""vLLM's JSON-valued flags (`--kv-events-config`, `--kv-transfer-config`, `--pooler-config`):
one reading, so each is refused the same way — not JSON, not an object, or with a key vLLM's
config class does not have (vLLM's dataclass configs refuse unknown fields too)."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any


def json_object(text: str, what: str, known: Collection[str]) -> dict[str, Any]:
    """`text` parsed as a JSON object with keys among `known`; ValueError naming `what`."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{what} must be a JSON object")
    unknown = sorted(set(doc) - set(known))
    if unknown:
        raise ValueError(f"{what}: unknown key(s) {', '.join(unknown)}")
    return doc
