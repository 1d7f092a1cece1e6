"""Sleep mode over HTTP, as vLLM serves it (vllm/entrypoints/serve/sleep/api_router.py @
09cb327): `POST /sleep?level=&mode=`, `POST /wake_up?tags=...`, `GET /is_sleeping`.

vLLM mounts these only with VLLM_SERVER_DEV_MODE=1; here they are always there (issue 13:
sleep mode always available, `--enable-sleep-mode` accepted). The command reaches every
deployment this front end serves (a pod serves one) and returns when every engine applied it:
a wake-up returns once the weights are back on the emulated timeline. Bad level or mode:
400 in vLLM's error shape.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.engine.interface import EngineError, InvalidRequest
from server.engine_proc.sleep import LEVELS, MODES, TAGS
from server.http.errors import HttpError, error_response
from server.http.state import HttpState
from server.ipc import messages as m


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise HttpError(400, f"{name} must be an integer, got {text!r}", "BadRequestError",
                        name) from None


def add_sleep_routes(app: FastAPI, state: HttpState) -> None:
    async def to_all(make) -> None:
        await asyncio.gather(*(c.control(make) for c in state.fleet.clients.values()))

    async def run(make) -> Response:
        try:
            await to_all(make)
        except InvalidRequest as e:
            return error_response(HttpError(400, str(e), "BadRequestError"), "")
        except EngineError as e:
            return error_response(HttpError(503, str(e), "ServiceUnavailableError"), "")
        return Response(status_code=200)

    @app.post("/sleep")
    async def sleep(request: Request) -> Response:
        try:
            level = _int(request.query_params.get("level", "1"), "level")
            mode = request.query_params.get("mode", "abort")
            if level not in LEVELS or mode not in MODES:
                raise HttpError(400, f"sleep level must be one of {LEVELS} and mode one of "
                                f"{MODES}", "BadRequestError", "level")
        except HttpError as e:
            return error_response(e, "")
        return await run(lambda fe, seq: m.Sleep(fe, seq, level, mode))

    @app.post("/wake_up")
    async def wake_up(request: Request) -> Response:
        tags = tuple(request.query_params.getlist("tags"))
        bad = [t for t in tags if t not in TAGS]
        if bad:
            return error_response(HttpError(400, f"unknown wake_up tags {bad}; known: "
                                            f"{list(TAGS)}", "BadRequestError", "tags"), "")
        return await run(lambda fe, seq: m.WakeUp(fe, seq, tags))

    @app.get("/is_sleeping")
    async def is_sleeping() -> JSONResponse:
        return JSONResponse({"is_sleeping": any(
            c.is_sleeping() for c in state.fleet.clients.values())})
