"""What the HTTP apps of pods that imitate another engine's server share (SGLang's,
TensorRT-LLM's): FastAPI's failures answered in that server's shapes, and the OpenAI
generation routes — the same handlers as a vLLM pod's — answering with the served model
whatever a request's `model` says (neither server checks it: each serves one model)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from server.frontend.deployment import DeploymentClient
from server.http.errors import HttpError, validation_error
from server.http.flat_errors import flat
from server.http.protocol import ChatCompletionRequest, CompletionRequest
from server.http.routes import chat_completion, completion, parse
from server.http.state import HttpState

log = logging.getLogger("doppelchip.http")


def pod_client(state: HttpState) -> DeploymentClient:
    """The pod's one deployment (both servers serve one model)."""
    return next(iter(state.fleet.clients.values()))


def add_error_handlers(app: FastAPI, answer: Callable[[Request, HttpError], Response]) -> None:
    """An `HttpError`, raised or made of an unexpected exception (500), answered by `answer`; a
    body that fails validation 400 in the flat `ErrorResponse` (both servers turn FastAPI's 422
    into 400); an unknown route or method FastAPI's `{"detail": ...}`; a client that hung up
    while its body was read 499 (nobody reads it)."""
    @app.exception_handler(HttpError)
    async def on_http_error(request: Request, e: HttpError) -> Response:
        return answer(request, e)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, e: RequestValidationError) -> Response:
        return JSONResponse(flat(validation_error(list(e.errors())).body()), 400)

    @app.exception_handler(HTTPException)
    async def on_starlette(request: Request, e: HTTPException) -> Response:
        return JSONResponse({"detail": e.detail}, e.status_code, headers=e.headers)

    @app.exception_handler(ClientDisconnect)
    async def on_gone(request: Request, e: ClientDisconnect) -> Response:
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, e: Exception) -> Response:
        log.exception("unexpected error on %s", request.url.path)
        return answer(request, HttpError(500, f"{type(e).__name__}: {e}", "InternalServerError"))


def add_openai_generation(app: FastAPI, state: HttpState, names: tuple[str, ...]) -> None:
    """`/v1/completions` and `/v1/chat/completions`; a `model` not in `names` is answered as
    the first of them."""
    def served(body):
        return body if body.model in names else body.model_copy(update={"model": names[0]})

    @app.post("/v1/completions")
    async def create_completion(request: Request) -> Response:
        return await completion(state, request, served(await parse(request, CompletionRequest)))

    @app.post("/v1/chat/completions")
    async def create_chat_completion(request: Request) -> Response:
        body = served(await parse(request, ChatCompletionRequest))
        return await chat_completion(state, request, body)
