"""The front end's side of vLLM 0.34.0's fault tolerance: what its `AsyncMPClient` keeps
(`vllm/v1/engine/core_client.py`: `handle_fault`, `get_status`, read, not copied) for the one
engine a fault-tolerant pod runs (vLLM allows one API server and external load balancing only).

Each engine's entry is its last pushed status (`{"id", "status"}`, with `fault_info` while
unhealthy), read from its stats file (server/engine_proc/sentinel.py writes it). `handle`
decorates the entry: `ft_state` "recovering" and `last_ft_request_id` while the instruction
runs, `ft_state` "failed" and `ft_error` when it was refused; the next push replaces the entry
and drops them, as vLLM's client replaces its cached entry. A second instruction while one
runs is refused ("another recovery is in progress") without touching the entry.
"""

from __future__ import annotations

import json
from typing import Any

from server.engine.errors import EngineError
from server.engine_proc.sentinel import FAULT_INFO, STATUSES
from server.frontend.deployment import DeploymentClient
from server.ipc import messages as m


class FaultToleranceClient:
    """One front end's fault-tolerance view of a pod's engine (rank 0 of its client)."""

    def __init__(self, client: DeploymentClient) -> None:
        self.client = client
        self._extra: tuple[tuple[int, int], dict[str, Any]] | None = None  # (push, fields)

    def _pushed(self) -> tuple[dict[str, Any], tuple[int, int]]:
        """The engine's last pushed entry, and which push it was (epoch, count)."""
        view = self.client.views[0]
        values, _ = view.read()
        status = STATUSES[int(view.value(values, "_ft_status"))]
        entry: dict[str, Any] = {"id": view.info.dp_rank, "status": status}
        if status == "unhealthy":
            entry["fault_info"] = FAULT_INFO
        push = (int(view.value(values, "_epoch")), int(view.value(values, "_ft_pushes")))
        return entry, push

    def entry(self) -> dict[str, Any]:
        """The cached entry: the last push, with this client's decorations since it."""
        entry, push = self._pushed()
        if self._extra is not None and self._extra[0] == push:
            entry.update(self._extra[1])
        return entry

    def status(self) -> dict[str, Any]:
        """`GET /v1/fault_tolerance/status`'s body."""
        return {"schema_version": 1, "total_engines": len(self.client.views),
                "engines": [self.entry()]}

    async def handle(self, instruction: str, params: dict, request_id: str
                     ) -> tuple[bool, str | None]:
        """Send one instruction to the engine: (success, reason)."""
        if self.entry().get("ft_state") == "recovering":
            return False, "another recovery is in progress"
        _, push = self._pushed()
        self._extra = (push, {"ft_state": "recovering", "last_ft_request_id": request_id})
        try:
            await self.client.control(lambda fe, seq: m.FaultTolerance(
                fe, seq, instruction, json.dumps(params), request_id))
        except EngineError as e:
            _, push = self._pushed()  # (a push since replaced the entry: decorate the new one)
            self._extra = (push, {"ft_state": "failed", "last_ft_request_id": request_id,
                                  "ft_error": str(e)})
            return False, str(e)
        return True, None
