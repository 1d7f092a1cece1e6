"""SGLang's error shapes (sglang 0.5.23 `http_server.py`): a native route's refusal is
`_create_error_response` — `{"error": {"message": ...}}` with the status (400 for a ValueError);
an error in the middle of a `/generate` stream is one more event, `{"error": {"message", "type":
"invalid_request_error", "code", "retryable": false}}`, before `data: [DONE]`; the OpenAI routes
answer `ErrorResponse` — `{"object": "error", "message", "type", "param", "code"}` — which
`server.http.flat_errors.OpenAIErrors` writes from the vLLM-shaped answers of the routes they
share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from server.http.errors import HttpError
from server.http.generate import Framing


def body(e: HttpError) -> dict:
    return {"error": {"message": e.message}}


def sglang_error(e: HttpError) -> Response:
    return Response(msgspec.json.encode(body(e)), status_code=e.status,
                    media_type="application/json")


async def with_json(request: Request, answer: Callable[[object], Awaitable[Response]]
                    ) -> Response:
    """`answer(body)` for the request's JSON body, or SGLang's 400 when it is not JSON."""
    try:
        body = await request.json()
    except ValueError as e:
        return sglang_error(HttpError(400, f"JSON decode error: {e}"))
    return await answer(body)


def _stream_error(e: HttpError) -> bytes:
    return b"data: " + msgspec.json.encode(
        {"error": {"message": e.message, "type": "invalid_request_error", "code": e.status,
                   "retryable": False}}) + b"\n\n"


_encode = msgspec.json.Encoder().encode
FRAMING = Framing(lambda e: b"data: " + _encode(e) + b"\n\n", _stream_error,
                  b"data: [DONE]\n\n", body)
