"""vLLM 0.34.0's fault-tolerance routes (vllm/entrypoints/serve/fault_tolerance/api_router.py),
mounted as vLLM mounts them: with `--enable-fault-tolerance` (a pod of one engine).

Why: an orchestrator that recovers a data-parallel group after a rank fails drives these (the
engine's side is server/engine_proc/sentinel.py, the client's server/frontend/
fault_tolerance.py):

- `POST /v1/fault_tolerance/apply` (JSON: `instruction` "retry" or "scale_down", `params`, a
  `request_id` naming the recovery round): 202 `{"message", "request_id"}` at once, the
  instruction applied in the background (its outcome shows in the status); vLLM's 400s for a
  body that is not an object, no or an unknown instruction, `params` not an object, no
  `request_id`; a Content-Type other than application/json is vLLM's validation error.
- `GET /v1/fault_tolerance/status`: `{"schema_version": 1, "total_engines", "engines": [...]}`.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.engine_proc.sentinel import INSTRUCTIONS
from server.frontend.fault_tolerance import FaultToleranceClient
from server.http.body import UNSUPPORTED_MEDIA, media_type_ok
from server.http.errors import HttpError, error_response, validation_error
from server.http.state import HttpState


def _instruction(body: object) -> tuple[str, dict, str]:
    """vLLM's `_validate_payload`: (instruction, params, request_id), or its 400."""
    if not isinstance(body, dict):
        raise HttpError(400, "Request body must be a JSON object.")
    instruction = body.get("instruction")
    if not instruction:
        raise HttpError(400, "'instruction' is required.")
    if instruction not in INSTRUCTIONS:
        raise HttpError(400, f"Invalid instruction: '{instruction}'.")
    params = body.get("params", {})
    if not isinstance(params, dict):
        raise HttpError(400, "'params' must be an object.")
    request_id = body.get("request_id")
    if not isinstance(request_id, str) or not request_id:
        raise HttpError(400, "'request_id' must be a non-empty string.")
    return instruction, params, request_id


def add_fault_tolerance_routes(app: FastAPI, state: HttpState) -> None:
    ft = FaultToleranceClient(state.fleet.get(state.fleet.default_name))
    running: set[asyncio.Task] = set()  # the instructions in flight (held until they end)

    @app.post("/v1/fault_tolerance/apply", status_code=202)
    async def apply(request: Request) -> Response:
        if not media_type_ok(request.headers.get("content-type", "")):
            return error_response(validation_error([UNSUPPORTED_MEDIA]))
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response(HttpError(400, "Invalid JSON format"))
        try:
            instruction, params, request_id = _instruction(body)
        except HttpError as e:
            return error_response(e)
        task = asyncio.create_task(ft.handle(instruction, params, request_id))
        running.add(task)
        task.add_done_callback(running.discard)
        return JSONResponse({"message": "Request accepted; poll /v1/fault_tolerance/status "
                                        "for updates.", "request_id": request_id},
                            status_code=202)

    @app.get("/v1/fault_tolerance/status")
    async def status() -> JSONResponse:
        return JSONResponse(ft.status())
