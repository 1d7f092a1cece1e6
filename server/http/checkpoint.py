"""vLLM 0.34.0's process-checkpoint routes (vllm/entrypoints/serve/checkpoint/api_router.py),
mounted as vLLM mounts them: for a generating model served with `--enable-sleep-mode`.

Why: an orchestrator that scales pods from zero by capturing a warm process drives these (the
engine's side is server/engine_proc/checkpoint.py). Every answer is `{"state": ...}` (with
`"error"` once failed), the deployments' ranks combined as vLLM's DP client combines them:

- `POST /checkpoint/prepare?mode=wait|abort|keep` (default wait): from running, starts the
  prepare and returns (200) with the state then (preparing, or prepared when nothing was in
  flight); an engine refusal (asleep) is a 400 with the state; preparing or prepared: 200,
  nothing changes; restoring or failed: 400.
- `POST /checkpoint/restore`: prepared → restored and serving (200, running); running or
  restoring: 200, nothing changes; preparing or failed: 400.
- `GET /checkpoint/status`: 200 once prepared (safe to capture), 500 once failed, 503 else.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated, Literal

from fastapi import FastAPI, Query
from starlette.responses import JSONResponse

from server.engine.errors import EngineError
from server.engine_proc.checkpoint import CheckpointState, combined, decode
from server.http.state import HttpState
from server.ipc import messages as m

S = CheckpointState


def _answer(state: CheckpointState, error: str | None, status: HTTPStatus) -> JSONResponse:
    body: dict[str, str] = {"state": str(state)}
    if error is not None:
        body["error"] = error
    return JSONResponse(body, status_code=status.value)


def add_checkpoint_routes(app: FastAPI, state: HttpState) -> None:
    async def ask(action: str, mode: str = "wait") -> tuple[CheckpointState, str | None]:
        """Send `action` to every engine; their states after it, combined (each engine
        answers a prepare or a restore with its state then: no second round trip)."""
        answers = await state.fleet.control(lambda fe, seq: m.Checkpoint(fe, seq, action, mode))
        return combined([decode(a.message) for a in answers])

    @app.post("/checkpoint/prepare")
    async def checkpoint_prepare(
            mode: Annotated[Literal["abort", "wait", "keep"], Query()] = "wait") -> JSONResponse:
        """Drain with `mode` and release what a checkpoint must not contain. Returns once
        started; poll /checkpoint/status."""
        now, error = await ask("state")
        if now == S.RUNNING:
            try:
                now, error = await ask("prepare", mode)
            except EngineError as e:
                return _answer(now, str(e), HTTPStatus.BAD_REQUEST)
        elif now in (S.RESTORING, S.FAILED):
            return _answer(now, error, HTTPStatus.BAD_REQUEST)
        return _answer(now, error, HTTPStatus.OK)

    @app.post("/checkpoint/restore")
    async def checkpoint_restore() -> JSONResponse:
        """Bring back what preparing released and serve; a restore in progress or done
        returns 200 (orchestrators may redeliver)."""
        now, error = await ask("state")
        if now in (S.PREPARING, S.FAILED):
            return _answer(now, error, HTTPStatus.BAD_REQUEST)
        if now == S.PREPARED:
            now, error = await ask("restore")
        return _answer(now, error, HTTPStatus.OK)

    @app.get("/checkpoint/status")
    async def checkpoint_status() -> JSONResponse:
        now, error = await ask("state")
        status = {S.PREPARED: HTTPStatus.OK, S.FAILED: HTTPStatus.INTERNAL_SERVER_ERROR}.get(
            now, HTTPStatus.SERVICE_UNAVAILABLE)
        return _answer(now, error, status)
