"""The HTTP application of an SGLang pod (`--http-api sglang`): SGLang 0.5.23's server as
routers and tools that speak SGLang use it (smg and sgl-router in HTTP mode poll `/v1/loads`,
detect the backend by `/v1/models`' `owned_by` and `/server_info`, route `/generate`).

Routes: the native ones (`server.http.sglang.native`); for a generative model `/generate` and
the OpenAI ones (`/v1/completions`, `/v1/chat/completions` — the same handlers as a vLLM
pod's, their refusals in SGLang's flat `ErrorResponse`), for a pooling model `/encode`,
`/v1/embeddings` and `/v1/rerank` (`server.http.sglang.pooling`); `/v1/models` (`owned_by`
"sglang", `max_model_len`), and `/metrics` with `--enable-metrics` only (SGLang mounts it only
then). Not here: vLLM's own routes (`/version`, `/load`, `/ping`, `/tokenize`, ...).

Errors: a refused body is 400 (SGLang turns FastAPI's 422 into 400 too); an unknown route 404
`{"detail": "Not Found"}` (FastAPI's, which SGLang keeps). `--api-key`: every route but
`/health*`, `/ready*` and `/metrics*` needs `Authorization: Bearer KEY`, else 401
`{"error": "Unauthorized"}` (SGLang's `decide_request_auth`).
"""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from server import metrics as exposition
from server.auth import ApiKeys
from server.http.errors import HttpError
from server.http.flat_errors import OpenAIErrors, flat
from server.http.pod_app import add_error_handlers, add_openai_generation, pod_client
from server.http.sglang.errors import sglang_error, with_json
from server.http.sglang.generate import generate
from server.http.sglang.native import add_native_routes
from server.http.sglang.pooling import add_pooling_routes
from server.http.state import HttpState

PUBLIC = ("/health", "/ready", "/metrics")  # SGLang's: matched by prefix


class SglangApiKey:
    """`--api-key` as SGLang checks it (pure ASGI, before routing)."""

    def __init__(self, app: ASGIApp, keys: ApiKeys) -> None:
        self.app, self.keys = app, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS" \
                and not scope["path"].startswith(PUBLIC):
            authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            if not self.keys.verify(authorization):
                await JSONResponse({"error": "Unauthorized"}, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def model_cards(state: HttpState) -> list[dict]:
    info = pod_client(state).info
    return [{"id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
             "root": name, "parent": None, "max_model_len": info.capacity.max_model_len}
            for name in (info.served_model_names or (info.model_name,))[:1]]


def add_generation_routes(app: FastAPI, state: HttpState) -> None:
    """`/generate` and the OpenAI generation routes (a generative model's)."""
    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate_route(request: Request) -> Response:
        return await with_json(request, lambda body: generate(state, request, body))

    info = pod_client(state).info  # SGLang answers whatever `model` says
    add_openai_generation(app, state, info.served_model_names or (info.model_name,))


def answer(request: Request, e: HttpError) -> Response:
    """SGLang's error body; an OpenAI route's in the flat `ErrorResponse`."""
    if request.url.path.startswith("/v1/"):
        return JSONResponse(flat(e.body()), e.status)
    return sglang_error(e)


def build_sglang_app(state: HttpState, keys: ApiKeys | None = None) -> FastAPI:
    app = FastAPI()
    app.state.http = state
    add_error_handlers(app, answer)
    add_native_routes(app, state)

    if pod_client(state).limits.pooling_task:  # SGLang's routes for a pooling model
        add_pooling_routes(app, state)
    else:
        add_generation_routes(app, state)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": model_cards(state)}

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> Response:
        for card in model_cards(state):
            if card["id"] == model:
                return JSONResponse(card)
        return JSONResponse({"error": {"message": f"The model '{model}' does not exist",
                                       "type": "invalid_request_error", "param": "model",
                                       "code": "model_not_found"}}, 404)

    if state.enable_metrics:
        @app.get("/metrics")
        async def metrics() -> Response:
            body = await asyncio.to_thread(state.metrics.render)
            return Response(body, media_type=exposition.CONTENT_TYPE)

    app.add_middleware(OpenAIErrors)
    if keys:
        app.add_middleware(SglangApiKey, keys=keys)
    return app
