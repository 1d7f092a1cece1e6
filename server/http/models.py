"""`/v1/models`' cards as vLLM 0.33.0 writes them (`serve/engine/protocol.py` ModelCard and
ModelPermission, `openai/models/serving.py`): made when asked (`created` is now), each with
one default permission; `owned_by` names this server."""

from __future__ import annotations

import uuid


def model_card(name: str, root: str | None, parent: str | None, max_model_len: int | None,
               now: int) -> dict:
    return {"id": name, "object": "model", "created": now, "owned_by": "doppelchip",
            "root": root, "parent": parent, "max_model_len": max_model_len,
            "permission": [_permission(now)]}


def _permission(now: int) -> dict:
    """vLLM's `ModelPermission()` defaults."""
    return {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
            "created": now, "allow_create_engine": False, "allow_sampling": True,
            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
            "allow_fine_tuning": False, "organization": "*", "group": None,
            "is_blocking": False}
