"""The routes (vLLM 0.33.0's, docs/HTTP.md): thin handlers over `generate`, `completions`,
`chat` and the fleet. A request's `model` resolves through `Fleet.resolve("", model)` — the one
place names map to deployments; no `model` means the default deployment.

`X-Request-Id`: the request's id is the header's value, else the body's `request_id`, else a
random one; generation responses (and their errors) carry it back in `X-Request-Id`, and the
response `id` is `cmpl-<id>` / `chatcmpl-<id>` as in vLLM. The engine sees `<that>-<8 random
hex>` (vLLM's `assign_request_id`), so clients may reuse ids.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from importlib.metadata import version
from typing import Any, TypeVar

import msgspec
from fastapi import FastAPI
from pydantic import BaseModel, TypeAdapter
from starlette.requests import Request
from starlette.responses import Response

from server import metrics as exposition
from server.engine.errors import InvalidRequest
from server.engine.interface import DeploymentState, EngineRequest
from server.fleet import UnknownDeployment
from server.frontend import request_ids
from server.frontend.deployment import DeploymentClient
from server.frontend.lora import tag as lora_tag
from server.http import chat, completions, generate, prompts, tools
from server.http import lora as lora_routes
from server.http.answering import answer, counted
from server.http.body import parse_json
from server.http.errors import HttpError, draining, error_response, unknown_model
from server.http.models import model_card
from server.http.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    G,
    TokenizeChatRequest,
    TokenizeRequest,
    forced_usage,
    tokens_as_ids,
)
from server.http.render_metrics import rendering
from server.http.state import VLLM_VERSION, HttpState

M = TypeVar("M", bound=BaseModel)


async def parse(request: Request, model: type[M] | TypeAdapter) -> M:
    """The JSON body as vLLM's routes take it (`server.http.body`)."""
    return await parse_json(request, model)


def resolve(state: HttpState, model: str | None) -> tuple[DeploymentClient, str]:
    """The deployment serving `model` and the name to answer with."""
    try:
        client = state.fleet.resolve("", model or "")
    except UnknownDeployment:
        raise unknown_model(model or "", state.fleet.model_names()) from None
    return client, model or client.info.model_name


def request_id(request: Request, body_id: str | None) -> str:
    return request.headers.get("x-request-id") or body_id or uuid.uuid4().hex


def opened(state: HttpState, rid: str, model: str | None) -> tuple[DeploymentClient, str]:
    """A generation request's first checks, in vLLM's order: its id, a draining server, then
    the deployment its `model` names (and the name to answer with)."""
    checked_id(rid)
    if state.draining:
        raise draining()
    return resolve(state, model)


def data_parallel_rank(request: Request) -> int | None:
    """The engine core a router pinned the request to: vLLM's `X-data-parallel-rank` header
    (`_get_data_parallel_rank`: None when absent or not an integer; out of range is the
    deployment's 400)."""
    text = request.headers.get("x-data-parallel-rank")
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def with_session(body: G, request: Request) -> G:
    """vLLM's `_get_session_id`: the body's `session_id`, else the `X-Session-ID` header, else
    a non-empty string `session_id` in `vllm_xargs` (None: no session); the body carries it
    on to the engine request."""
    sid = body.session_id or request.headers.get("x-session-id") or None
    if sid is None and body.vllm_xargs:
        value = body.vllm_xargs.get("session_id")
        sid = value if isinstance(value, str) and value else None
    return body if sid == body.session_id else body.model_copy(update={"session_id": sid})


def pinned(reqs: list[EngineRequest], rank: int | None) -> list[EngineRequest]:
    """The requests pinned to engine core `rank` (None: left to the least-loaded rank)."""
    if rank is None:
        return reqs
    return [msgspec.structs.replace(r, data_parallel_rank=rank) for r in reqs]


def checked_id(rid: str) -> None:
    """The client's id, as every front door checks it (`request_ids.check`), or a 400."""
    try:
        request_ids.check(rid)
    except InvalidRequest as e:
        raise HttpError(400, str(e), "BadRequestError", "request_id") from None


def engine_id(rid: str) -> str:
    return f"{rid}-{uuid.uuid4().hex[:8]}"


def healthy(state: HttpState) -> bool:
    """Serving: not draining and at least one deployment ready (one deployment per pod: that
    one is ready)."""
    if state.draining:
        return False
    return any(c.status().state is DeploymentState.READY
               for c in state.fleet.clients.values())


def add_routes(app: FastAPI, state: HttpState) -> None:
    lora_routes.add_lora_routes(app, state)  # --- LoRA (issue 13) ---

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if healthy(state) else 503)

    @app.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:
        return Response(status_code=200 if healthy(state) else 503)

    @app.get("/load")
    async def load() -> dict:  # vLLM's: 0 unless --enable-server-load-tracking
        return {"server_load": state.server_load}

    @app.get("/version")
    async def version_() -> dict:
        return {"version": VLLM_VERSION, "doppelchip_version": version("doppelchip")}

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics() -> Response:
        body = await asyncio.to_thread(state.metrics.render)
        return Response(body, media_type=exposition.CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict:
        now = int(time.time())  # vLLM's cards are made when asked: `created` is now
        cards = []
        for name, clients in state.fleet.models.items():
            c = clients[0]
            cards.append(model_card(name, c.info.model_path or c.info.model, None,
                                    c.info.capacity.max_model_len, now))
        cards += lora_routes.model_cards(state, now)  # --- LoRA (issue 13) ---
        return {"object": "list", "data": cards}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        body = await parse(request, TokenizeRequest)
        if state.draining:
            raise draining()
        client, _ = resolve(state, body.model)
        tok = state.tokenizer
        limits = client.limits
        if isinstance(body, TokenizeChatRequest):
            ids = await prompts.chat_prompt(body.messages, tok, limits, body.add_generation_prompt,
                                            body.continue_final_message)
        else:
            ids = await prompts.text_prompt(body.prompt, tok, limits)
        if body.add_special_tokens and ids:
            ids = [tok.bos_token_id, *ids]
        out: dict[str, Any] = {"count": len(ids),
                               "max_model_len": client.info.capacity.max_model_len,
                               "tokens": ids}
        # vLLM's TokenizeResponse: `token_strs` always there, the vocabulary's strings
        out["token_strs"] = tok.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return out

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        body = await parse(request, DetokenizeRequest)
        if state.draining:
            raise draining()
        resolve(state, body.model)
        size = state.tokenizer.vocab_size
        bad = next((t for t in body.tokens if not 0 <= t < size), None)
        if bad is not None:
            raise HttpError(400, f"token id {bad} is outside the vocabulary [0, {size})",
                            "BadRequestError", "tokens")
        # vLLM: `tokenizer.decode(ids)`, special tokens written out
        return {"prompt": state.tokenizer.decode_with_special(body.tokens)}

    @app.post("/v1/completions")
    async def create_completion(request: Request) -> Response:
        body = await parse(request, CompletionRequest)
        return await counted(state.load(), completion(state, request, body))

    @app.post("/v1/chat/completions")
    async def create_chat_completion(request: Request) -> Response:
        body = await parse(request, ChatCompletionRequest)
        return await counted(state.load(), chat_completion(state, request, body))


async def completion(state: HttpState, request: Request, body: CompletionRequest) -> Response:
    """A completions request's answer (`/v1/completions`, and `/invocations`'s)."""
    rid = request_id(request, body.request_id)
    body = tokens_as_ids(forced_usage(body, state.force_include_usage), state.tokens_as_ids)
    body = with_session(body, request)
    try:
        client, name = opened(state, rid, body.model)
        run, ids = await start_completion(state, client, body, f"cmpl-{rid}", rid,
                                          data_parallel_rank(request))
    except HttpError as e:
        return error_response(e, rid)
    shapes = completions.CompletionShapes(body, run, f"cmpl-{rid}", name, state.tokenizer, ids,
                                          state.per_request_metrics, state.vllm_api)
    return await answer(request, run, bool(body.stream), shapes.response, shapes.chunks,
                        [], shapes.tail, rid, keep_alive_s=state.sse_keep_alive_s)


async def start_completion(state: HttpState, client: DeploymentClient, body: CompletionRequest,
                           response_id: str, rid: str, rank: int | None = None,
                           rendered: bool = True) -> tuple[generate.Run, list[list[int]]]:
    """A completions request admitted to its deployment (or its HttpError): the run and each
    prompt's token ids; the engine sees `<response_id>-<8 hex>`; `rank` as `start_chat`'s.
    `/v1/completions` (and `/invocations`) and `/inference/v1/generate`
    (`server.http.scale_out`) start here; `rendered`: its render is timed (render_metrics)."""
    with rendering(state, client.info.model_name, "completion", rendered):
        ids = await prompts.completion_prompts(body, state.tokenizer, client.limits)
    reqs, n = completions.engine_requests(body, engine_id(response_id), ids, client.limits)
    reqs = [lora_tag(client, body.model, r) for r in reqs]  # --- LoRA (issue 13) ---
    return await generate.admitted(client, pinned(reqs, rank), n, rid), ids


async def chat_completion(state: HttpState, request: Request, body: ChatCompletionRequest
                          ) -> Response:
    """A chat request's answer (`/v1/chat/completions`, and `/invocations`'s)."""
    rid = request_id(request, body.request_id)
    body = tokens_as_ids(forced_usage(body, state.force_include_usage), state.tokens_as_ids)
    body = with_session(body, request)
    try:
        run, shapes = await start_chat(state, rid, body, data_parallel_rank(request))
    except HttpError as e:
        return error_response(e, rid)
    head = shapes.head() if body.stream else []
    return await answer(request, run, bool(body.stream), shapes.response, shapes.chunks,
                        head, shapes.tail, rid, keep_alive_s=state.sse_keep_alive_s)


async def start_chat(state: HttpState, rid: str, body: ChatCompletionRequest,
                     rank: int | None = None, request_type: str = "chat_completions"
                     ) -> tuple[generate.Run, chat.ChatShapes]:
    """A chat request admitted to its deployment (or its HttpError): the run and the shapes
    of its answer; `rank`: the engine core a router pinned it to (`data_parallel_rank`).
    `/v1/chat/completions`, `/v1/messages` and `/v1/responses` start here."""
    client, name = opened(state, rid, body.model)
    plan = tools.plan(body)
    # (vLLM renders a Responses request unobserved)
    with rendering(state, client.info.model_name, "chat", request_type != "responses"):
        ids = await prompts.chat_generation_prompt(body, state.tokenizer, client.limits)
    req, n = chat.engine_request(body, engine_id(f"chatcmpl-{rid}"), ids, plan, client.limits)
    req = lora_tag(client, body.model, req)  # --- LoRA (issue 13) ---
    run = await generate.admitted(client, pinned([req], rank), n, rid)
    record = (state.tool_parser.recorder(client.info.model_name, request_type)
              if state.tool_parser is not None and plan.auto else None)
    return run, chat.ChatShapes(body, run, f"chatcmpl-{rid}", name, state.tokenizer, plan,
                                list(req.prompt_token_ids or ()), record, state.response_role,
                                state.per_request_metrics, state.vllm_api)
