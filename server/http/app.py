"""The FastAPI application of one front end: error handlers, routes, HTTP metrics.

Error handlers turn every failure into vLLM's error shape: an `HttpError` as raised, a body
that fails validation → 400 `Bad Request` naming `body.<field>` (vLLM answers 400, not
FastAPI's 422), an unknown route → 404, anything unexpected → 500 `InternalServerError`; a
client that hangs up while its body is read is not an error (nobody is left to answer).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from server.http.errors import HttpError, error_response, validation_error
from server.http.kv_events import add_kv_event_routes
from server.http.metrics import instrument
from server.http.routes import add_routes
from server.http.sleep import add_sleep_routes
from server.http.state import VLLM_VERSION, HttpState

log = logging.getLogger("doppelchip.http")


def build_app(state: HttpState) -> FastAPI:
    app = FastAPI(title="doppelchip", version=VLLM_VERSION, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.http = state

    @app.exception_handler(HttpError)
    async def on_http_error(request: Request, e: HttpError) -> Response:
        return error_response(e, request.headers.get("x-request-id"))

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, e: RequestValidationError) -> Response:
        return error_response(validation_error(list(e.errors())))

    @app.exception_handler(HTTPException)
    async def on_starlette(request: Request, e: HTTPException) -> Response:
        return error_response(HttpError(e.status_code, str(e.detail)))

    @app.exception_handler(ClientDisconnect)
    async def on_gone(request: Request, e: ClientDisconnect) -> Response:
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, e: Exception) -> Response:
        log.exception("unexpected error on %s", request.url.path)
        return error_response(HttpError(500, f"{type(e).__name__}: {e}",
                                        "InternalServerError"))

    add_routes(app, state)
    add_kv_event_routes(app, state)  # KV events (issue 13)
    add_sleep_routes(app, state)  # sleep mode (issue 13)
    instrument(app)
    return app
