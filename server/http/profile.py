"""vLLM's profiling routes, mounted as vLLM 0.33.0 mounts them: only with `--profiler-config`
(`vllm/entrypoints/serve/profile/api_router.py`). `POST /start_profile` (an optional body
`{profile_prefix, delay_iterations, max_iterations, profiler_kwargs}`, vLLM's
`StartProfileRequest`: strict types, unknown fields ignored) starts a session on every engine
core of every deployment this front end serves; `POST /stop_profile` ends it once each engine
wrote its trace (server/engine_proc/profiler.py). Both answer 200 with an empty body.

Refusals as vLLM's: a bad `profile_prefix` or a negative bound is a 400 with vLLM's message; a
start while a session is active is vLLM's 409 "A profiling session is already active. ..."
(vLLM guards it with one API server; here every engine guards it, whatever the number of front
ends).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from server.engine.errors import AlreadyExists, EngineError, InvalidRequest
from server.engine.profiler_config import (
    validate_profile_iteration_bounds,
    validate_profile_prefix,
)
from server.http.errors import HttpError, error_response
from server.http.state import HttpState
from server.ipc import messages as m


class StartProfileRequest(BaseModel):
    """vLLM's optional overrides for one profiling session."""

    model_config = ConfigDict(extra="ignore", strict=True)

    profile_prefix: str | None = None
    delay_iterations: int | None = None
    max_iterations: int | None = None
    profiler_kwargs: dict[str, Any] | None = None  # accepted; nothing here to pass them to


def add_profile_routes(app: FastAPI, state: HttpState) -> None:
    async def to_all(make) -> Response:
        try:
            await state.fleet.control(make)
        except AlreadyExists as e:
            return error_response(HttpError(409, str(e), "Conflict"), "")
        except InvalidRequest as e:
            return error_response(HttpError(400, str(e), "BadRequestError"), "")
        except EngineError as e:
            return error_response(HttpError(503, str(e), "ServiceUnavailableError"), "")
        return Response(status_code=200)

    @app.post("/start_profile")
    async def start_profile(profile_request: StartProfileRequest | None = None) -> Response:
        r = profile_request or StartProfileRequest()
        try:
            validate_profile_prefix(r.profile_prefix)
            validate_profile_iteration_bounds(r.delay_iterations, r.max_iterations)
        except ValueError as e:
            return error_response(HttpError(400, str(e), "BadRequestError"), "")
        return await to_all(lambda fe, seq: m.Profile(fe, seq, True, r.profile_prefix,
                                                      r.delay_iterations, r.max_iterations))

    @app.post("/stop_profile")
    async def stop_profile() -> Response:
        return await to_all(lambda fe, seq: m.Profile(fe, seq, False))
