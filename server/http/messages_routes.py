"""The Messages API routes of a vLLM pod (`vllm/entrypoints/anthropic/api_router.py`):
`POST /v1/messages` (a chat request underneath: `server.http.messages`) and
`POST /v1/messages/count_tokens` (the rendered prompt's length, nothing generated).

As vLLM: a malformed body is the same 400 as every route's (`routes.parse`); an error after
that is `{"type": "error", "error": {"type", "message"}}` with the chat route's status and
type; both routes count in `/load` (`load_aware_call`). The request's id is `X-Request-Id`
(else a random one) and the answer's `id` is `chatcmpl-<id>`, as vLLM answers it.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from server.http import prompts
from server.http.answering import answer, counted
from server.http.errors import HttpError, draining, error_response
from server.http.generate import encode
from server.http.messages import FRAMING, error_body, message, to_chat
from server.http.messages_protocol import CountTokensRequest, MessagesRequest
from server.http.messages_stream import MessageEvents
from server.http.render_metrics import rendering
from server.http.routes import (
    data_parallel_rank,
    parse,
    request_id,
    resolve,
    start_chat,
    with_session,
)
from server.http.state import HttpState


def add_messages_routes(app: FastAPI, state: HttpState) -> None:
    @app.post("/v1/messages")
    async def create_message(request: Request) -> Response:
        body = await parse(request, MessagesRequest)
        return await counted(state.load(), _message(request, body))

    async def _message(request: Request, body: MessagesRequest) -> Response:
        rid = request_id(request, None)
        try:
            run, shapes = await start_chat(state, rid, with_session(to_chat(body), request),
                                           data_parallel_rank(request))
        except HttpError as e:
            return error_response(e, rid, error_body)
        if body.stream:
            events = MessageEvents(shapes)
            return await answer(request, run, True, None, events.chunks, events.head(),
                                events.tail, rid, FRAMING)
        return await answer(request, run, False, lambda: message(shapes.response()), None,
                            [], None, rid, FRAMING)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        body = await parse(request, CountTokensRequest)
        return await counted(state.load(), _count(body))

    async def _count(body: CountTokensRequest) -> Response:
        try:
            if state.draining:
                raise draining()
            chat_body = to_chat(body)
            client, _ = resolve(state, chat_body.model)
            with rendering(state, client.info.model_name, "chat"):
                ids = await prompts.chat_prompt(chat_body.messages, state.tokenizer,
                                                client.limits, add_generation_prompt=True)
        except HttpError as e:
            return error_response(e, None, error_body)
        n = len(ids)
        return Response(encode({"input_tokens": n,
                                "context_management": {"original_input_tokens": n}}),
                        media_type="application/json")
