"""The FastAPI application of one front end: error handlers, routes, HTTP metrics.

Error handlers turn every failure into vLLM's error shape: an `HttpError` as raised, a body
that fails validation → 400 `Bad Request` naming `body.<field>` (vLLM answers 400, not
FastAPI's 422; bodies are read by `server.http.body`), an unknown route → 404, a known route
with another method → 405 with `Allow`, anything unexpected → 500 `InternalServerError`; a
client that hangs up while its body is read is not an error (nobody is left to answer).

`--api-key` (`ApiKeyMiddleware`): as vLLM's `AuthenticationMiddleware`, a request to a guarded
path without `Authorization: Bearer <one of the keys>` gets 401 `{"error": "Unauthorized"}`
(vLLM's exact body) before any route runs; OPTIONS is never guarded. Which paths: every route
of the app except the probes' (`/health`, `/ping`, `/version`, `/metrics`, `/load`), with
`/v1` always guarded — the guard is derived from the route table, so a route added later (`/sleep`,
`/wake_up`, `/v1/load_lora_adapter`) is guarded without a change here. vLLM (commit baaf6e9,
`vllm/entrypoints/serve/middleware/authenticate.py`) guards only the `/v1`, `/v2`,
`/inference` and `/cohere` prefixes, leaving `/tokenize`, `/sleep` and `/wake_up` open;
issue 14 asks for them guarded, and docs/OPERATIONS.md records the difference. FastAPI's
/openapi.json, /docs and /redoc (served as vLLM serves them) are guarded the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from server.auth import ApiKeys
from server.http.chat_batch import add_chat_batch_routes
from server.http.checkpoint import add_checkpoint_routes
from server.http.classify import add_classify_route
from server.http.cohere_embed import add_cohere_route
from server.http.embeddings import add_embedding_routes
from server.http.errors import HttpError, error_response, validation_error
from server.http.fault_tolerance import add_fault_tolerance_routes
from server.http.kv_events import add_kv_event_routes
from server.http.messages_routes import add_messages_routes
from server.http.metrics import instrument
from server.http.pooling import all_pooling, any_pooling, classifies, embeds, scores
from server.http.profile import add_profile_routes
from server.http.responses_routes import add_responses_routes
from server.http.rl import add_rl_routes, dev_mode
from server.http.routes import add_routes
from server.http.sagemaker import add_sagemaker_routes
from server.http.scale_out import add_scale_out_routes
from server.http.scores import add_score_routes
from server.http.sleep import add_sleep_routes
from server.http.state import HttpState
from server.http.tokenizer_info import add_tokenizer_info_route

log = logging.getLogger("doppelchip.http")


# vLLM's PUBLIC_ENDPOINTS that exist here: open whatever the keys; `/v1` is always guarded.
PUBLIC_PATHS = ("/health", "/ping", "/version", "/metrics", "/load")
GUARDED_FLOOR = ("/v1",)
# the routes vLLM mounts only for a generating model (`register_generate_api_routers`, the
# Messages and Responses APIs, scale-out's generate and render routes)
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses",
                    "/v1/messages", "/inference/v1/")


def _public(path: str, public: Sequence[str] = PUBLIC_PATHS) -> bool:
    return any(path == p or path.startswith(p + "/") for p in public)


def guarded_prefixes(routes: Sequence[object], public: Sequence[str] = PUBLIC_PATHS
                     ) -> tuple[str, ...]:
    """The path prefixes `--api-key` guards: `/v1`, and the static part of every route that
    is not public (a template `/v1/x/{id}` guards `/v1/x/`)."""
    out = set(GUARDED_FLOOR)
    for route in routes:
        path = getattr(route, "path", None)
        if isinstance(path, str) and not _public(path, public):
            out.add(path.split("{", 1)[0] or "/")
    return tuple(sorted(out))


class ApiKeyMiddleware:
    """401 for a guarded path without a valid `Authorization: Bearer KEY` (pure ASGI, so a
    refused request costs no routing, parsing or metrics beyond its count)."""

    def __init__(self, app: ASGIApp, keys: ApiKeys, routes: Callable[[], Sequence[object]],
                 public: Sequence[str] = PUBLIC_PATHS) -> None:
        self.app, self.keys, self.routes, self.public = app, keys, routes, tuple(public)
        self._guarded: tuple[str, ...] = ()
        self._known = -1  # how many routes the guard was derived from

    def guarded(self, path: str) -> bool:
        routes = self.routes()
        if len(routes) != self._known:  # routes are only ever added
            self._guarded, self._known = guarded_prefixes(routes, self.public), len(routes)
        return path.startswith(self._guarded) and not _public(path, self.public)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS" \
                and self.guarded(scope["path"]):
            authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            if not self.keys.verify(authorization):
                await JSONResponse({"error": "Unauthorized"}, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def build_app(state: HttpState, keys: ApiKeys | None = None) -> FastAPI:
    # vLLM's `FastAPI()`: its defaults — /openapi.json, /docs, /redoc, title "FastAPI"
    # (vLLM's --disable-fastapi-docs has no doppelchip flag)
    app = FastAPI()
    app.state.http = state

    @app.exception_handler(HttpError)
    async def on_http_error(request: Request, e: HttpError) -> Response:
        return error_response(e, request.headers.get("x-request-id"))

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, e: RequestValidationError) -> Response:
        return error_response(validation_error(list(e.errors())))  # locations as FastAPI's

    @app.exception_handler(HTTPException)
    async def on_starlette(request: Request, e: HTTPException) -> Response:
        response = error_response(HttpError(e.status_code, str(e.detail)))
        response.headers.update(e.headers or {})  # 405's Allow
        return response

    @app.exception_handler(ClientDisconnect)
    async def on_gone(request: Request, e: ClientDisconnect) -> Response:
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, e: Exception) -> Response:
        log.exception("unexpected error on %s", request.url.path)
        return error_response(HttpError(500, f"{type(e).__name__}: {e}",
                                        "InternalServerError"))

    add_routes(app, state)
    add_chat_batch_routes(app, state)  # vLLM's /v1/chat/completions/batch
    add_kv_event_routes(app, state)  # KV events (issue 13)
    add_sleep_routes(app, state)  # sleep mode (issue 13)
    add_messages_routes(app, state)  # Anthropic's Messages API (vLLM's /v1/messages)
    add_responses_routes(app, state)  # OpenAI's Responses API (vLLM's /v1/responses)
    add_sagemaker_routes(app, state)  # SageMaker's /invocations (vLLM's)
    # vLLM's render and token-in/token-out routes (403 stubs without --enable-scale-out)
    add_scale_out_routes(app, state, state is not None and state.scale_out)
    if dev_mode():  # vLLM's RL routes: /pause, /resume, /is_paused, /abort_requests
        add_rl_routes(app, state)
    if state is None or state.profiler:  # vLLM's, with --profiler-config (None: route table)
        add_profile_routes(app, state)
    if state is None or state.tokenizer_info:  # vLLM's, with --enable-tokenizer-info-endpoint
        add_tokenizer_info_route(app, state)
    if (state is None or state.checkpoint) and not all_pooling(state):  # vLLM 0.34.0's, with
        add_checkpoint_routes(app, state)  # --enable-sleep-mode, for a generating model
    if state is not None and state.fault_tolerance:  # vLLM 0.34.0's, with
        add_fault_tolerance_routes(app, state)  # --enable-fault-tolerance (a pod)
    if any_pooling(state):  # a pooling model's routes (vLLM's register_pooling_api_routers)
        add_embedding_routes(app, state)
        if any_pooling(state, embeds):
            add_cohere_route(app, state)  # Cohere's /v2/embed
        if any_pooling(state, classifies):
            add_classify_route(app, state)
        if any_pooling(state, scores):
            add_score_routes(app, state)
    if all_pooling(state):  # vLLM mounts the generation routes for the generate task only
        app.router.routes[:] = [r for r in app.router.routes
                                if not getattr(r, "path", "").startswith(GENERATION_PATHS)]
    if keys:  # inside the metrics middleware: refused requests are counted (status 4xx)
        app.add_middleware(ApiKeyMiddleware, keys=keys, routes=lambda: app.router.routes)
    instrument(app)
    return app
