"""The Responses API routes of a vLLM pod (`vllm/entrypoints/openai/responses/api_router.py`),
as vLLM serves them without its response store (`VLLM_ENABLE_RESPONSES_API_STORE` unset):

- `POST /v1/responses`: a chat request underneath (`server.http.responses`); `store` is
  silently treated as false, as vLLM treats it. So `previous_response_id` names nothing
  (404 "Response with id '…' not found.", `param` response_id), and `background` (which needs
  the store) is a 400 with vLLM's message.
- `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`: nothing is stored, so each is
  that 404.

As vLLM: a malformed body is the same 400 as every route's (`routes.parse`); errors are
OpenAI's `{"error": …}` with the chat route's status; the route counts in `/load`.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from server.http.errors import HttpError, draining, error_response
from server.http.responses import framing, response, to_chat
from server.http.responses_protocol import ResponsesRequest
from server.http.responses_stream import ResponseEvents
from server.http.routes import answer, counted, parse, request_id, resolve, start_chat
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
        rid = request_id(request, body.request_id)
        try:
            client, _ = resolve(state, body.model)
            _checks(body)
            limit = client.limits.max_model_len
            run, shapes = await start_chat(state, rid, to_chat(body, limit))
        except HttpError as e:
            return error_response(e, rid)
        if body.stream:
            events = ResponseEvents(body, rid, shapes, limit)
            return await answer(request, run, True, None, events.chunks, events.head(),
                                events.tail, rid, framing(events.error))
        return await answer(request, run, False,
                            lambda: response(body, rid, shapes.response(), limit),
                            None, [], None, rid)

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str) -> Response:
        return error_response(not_found(response_id))

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str) -> Response:
        return error_response(not_found(response_id))

    def _checks(body: ResponsesRequest) -> None:
        """vLLM's order (after the model): the store-less background refusal, the two
        histories, draining, then the earlier response (never stored here)."""
        if body.background:
            raise HttpError(400, _NO_BACKGROUND, "BadRequestError", "background")
        if body.previous_input_messages and body.previous_response_id:
            raise HttpError(400, "Only one of `previous_input_messages` and "
                            "`previous_response_id` can be set.", "BadRequestError",
                            "previous_response_id")
        if state.draining:
            raise draining()
        if body.previous_response_id is not None:
            raise not_found(body.previous_response_id)
