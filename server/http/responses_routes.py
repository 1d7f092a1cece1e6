"""The Responses API routes of a vLLM pod (`vllm/entrypoints/openai/responses/api_router.py`):

- `POST /v1/responses`: a chat request underneath (`server.http.responses`). Without the
  response store (vLLM's default) `store` is silently treated as false, as vLLM treats it, so
  `previous_response_id` names nothing (404 "Response with id '…' not found.", `param`
  response_id) and `background` (which needs the store) is a 400 with vLLM's message. With
  `VLLM_ENABLE_RESPONSES_API_STORE=1` (`responses_store.py`) a `store`d response is kept, a
  later request continues it, and `background` runs it in a task (`responses_background.py`).
- `GET /v1/responses/{id}` (`?stream=true&starting_after=N` replays a background stream) and
  `POST /v1/responses/{id}/cancel` (a background response only): the store's, else that 404.

As vLLM: a malformed body is the same 400 as every route's (`routes.parse`); errors are
OpenAI's `{"error": …}` with the chat route's status; the POST counts in `/load`.
"""

from __future__ import annotations

import time

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from server.http import responses_background as background
from server.http.answering import SSE_HEADERS, answer, counted
from server.http.chat import ChatShapes
from server.http.errors import HttpError, draining, error_response
from server.http.generate import Run, named_event
from server.http.responses import budget, framing, new_id, response, shell, to_chat
from server.http.responses_protocol import ResponsesRequest
from server.http.responses_store import ResponseStore
from server.http.responses_stream import ResponseEvents
from server.http.routes import (
    data_parallel_rank,
    parse,
    request_id,
    resolve,
    start_chat,
    with_session,
)
from server.http.state import HttpState

_NO_BACKGROUND = ("This vLLM engine does not support `store=True` and therefore does not "
                  "support the background mode. To enable these features, set the environment "
                  "variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server.")


def not_found(response_id: str) -> HttpError:
    return HttpError(404, f"Response with id '{response_id}' not found.", "BadRequestError",
                     "response_id")


def add_responses_routes(app: FastAPI, state: HttpState) -> None:
    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        body = await parse(request, ResponsesRequest)
        return await counted(state.load(), _response(request, body))

    async def _response(request: Request, body: ResponsesRequest) -> Response:
        body.request_id = body.request_id or new_id("resp")  # the response's id (vLLM's)
        rid = request_id(request, body.request_id)
        store = state.responses if body.store else None  # (vLLM: off without its store)
        try:
            client, _ = resolve(state, body.model)
            history = _checks(body)
            limit = client.limits.max_model_len
            chat = with_session(to_chat(body, limit, history), request)
            run, shapes = await start_chat(state, rid, chat, data_parallel_rank(request),
                                           "responses")
        except HttpError as e:
            return error_response(e, rid)
        messages = [m.model_dump(exclude_none=True) for m in chat.messages]
        if body.background:
            assert store is not None  # (`_checks`: background needs the store)
            return _background(store, body, run, shapes, limit, messages)
        if body.stream:
            events = ResponseEvents(body, shapes, limit, on_done=(
                None if store is None else lambda done: store.put(done, messages)))
            return await answer(request, run, True, None, events.chunks, events.head(),
                                events.tail, rid, framing(events.error))

        def answered() -> dict:
            done = response(body, shapes.response(), limit)
            if store is not None:
                store.put(done, messages)
            return done
        return await answer(request, run, False, answered, None, [], None, rid)

    def _background(store: ResponseStore, body: ResponsesRequest, run: Run,
                    shapes: ChatShapes, limit: int, messages: list[dict]) -> Response:
        queued = shell(body, shapes.model, int(time.time()),
                       budget(body, run.prompt_lens[0], limit), [], "queued", None)
        key = queued["id"]
        if body.stream:
            events = ResponseEvents(body, shapes, limit, on_done=store.put)
            background.start(store, queued, messages,
                             background.streamed(store, events, run, key))
            return StreamingResponse((named_event(e) async for e in store.replay(key, None)),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        background.start(store, queued, messages,
                         background.collected(store, body, run, shapes, limit, key))
        return JSONResponse(queued)

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str, stream: bool = False,
                                starting_after: int | None = None) -> Response:
        stored = state.responses.get(response_id) if state.responses is not None else None
        if stored is None:
            raise not_found(response_id)
        if not stream:
            return JSONResponse(stored)
        assert state.responses is not None
        if response_id not in state.responses.events:
            raise HttpError(400, f"Unknown response_id: {response_id}", "BadRequestError",
                            "response_id")
        return StreamingResponse((named_event(e) async for e in
                                  state.responses.replay(response_id, starting_after)),
                                 media_type="text/event-stream", headers=SSE_HEADERS)

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str) -> Response:
        stored = state.responses.get(response_id) if state.responses is not None else None
        if stored is None or state.responses is None:
            raise not_found(response_id)
        if stored["status"] not in ("queued", "in_progress"):
            raise HttpError(400, "Cannot cancel a synchronous response.", "BadRequestError",
                            "response_id")
        stored["status"] = "cancelled"
        await state.responses.cancel(response_id)
        return JSONResponse(stored)

    def _checks(body: ResponsesRequest) -> list[dict]:
        """vLLM's order (after the model): the store-less background refusal, the two
        histories, draining, then the earlier response: its conversation, to continue."""
        if body.background and state.responses is None:
            raise HttpError(400, _NO_BACKGROUND, "BadRequestError", "background")
        if body.previous_input_messages and body.previous_response_id:
            raise HttpError(400, "Only one of `previous_input_messages` and "
                            "`previous_response_id` can be set.", "BadRequestError",
                            "previous_response_id")
        if state.draining:
            raise draining()
        prev = body.previous_response_id
        if prev is None:
            return []
        if state.responses is None or state.responses.get(prev) is None:
            raise not_found(prev)
        return state.responses.history(prev)

