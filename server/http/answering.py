"""How a generation route answers: a stream of server-sent events or one JSON body, and the
request counted in flight until its response has been sent (vLLM's `load_aware_call`).

Why a module of its own: every generation route (completions, chat, messages, Responses,
token-in/token-out generate, the pooling routes' counting) answers through these, apart from
how each builds its request (server/http/routes.py and the route modules).
"""

from __future__ import annotations

from collections.abc import Awaitable

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from server.frontend import request_ids
from server.http import generate
from server.http.errors import HttpError, error_response
from server.http.sse_keep_alive import with_sse_keep_alive
from server.http.state import InFlight

SSE_HEADERS = {"Cache-Control": "no-cache"}


async def counted(load: InFlight, answering: Awaitable[Response]) -> Response:
    """vLLM's `load_aware_call` (--enable-server-load-tracking): the request counts in
    `server_load` until its response has been sent — a stream's last event, a JSON answer's
    bytes — or abandoned (the client gone, before or during the body)."""
    try:
        response = await answering
    except BaseException:
        load.done()
        raise
    return Counted(response, load)


class Counted(Response):
    """`response`, sent as it is, whose `InFlight` ends when the sending ends however it ends
    (a stream's body is not even started when its client left first: no generator `finally`
    or background task would run then)."""

    def __init__(self, response: Response, load: InFlight) -> None:  # (no body of its own)
        self.response, self.load, self.background = response, load, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            self.load.done()
        if self.background is not None:  # FastAPI's, had the route any
            await self.background()


async def answer(request: Request, run: generate.Run, stream: bool, response, chunks,
                 head: list[dict], tail, rid: str,
                 framing: generate.Framing = generate.OPENAI,
                 keep_alive_s: float = 0.0) -> Response:
    """The run's answer: streamed (`framing` writes the events; with `keep_alive_s`, a
    comment after that many idle seconds, as vLLM's completions and chat) or collected into
    `response()` (an error in `framing`'s error shape)."""
    headers = {"X-Request-Id": request_ids.metadata_value(rid)}
    if stream:
        events = with_sse_keep_alive(generate.sse(run, chunks, head, tail, framing),
                                     keep_alive_s)
        return StreamingResponse(events,
                                 media_type="text/event-stream",
                                 headers={**SSE_HEADERS, **headers})
    try:
        await generate.collect(run, request)
    except HttpError as e:
        return error_response(e, rid, framing.error_body)
    return Response(generate.encode(response()), media_type="application/json",
                    headers=headers)
