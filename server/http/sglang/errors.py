"""SGLang's error shapes (sglang 0.5.23 `http_server.py`): a native route's refusal is
`_create_error_response` — `{"error": {"message": ...}}` with the status (400 for a ValueError);
an error in the middle of a `/generate` stream is one more event, `{"error": {"message", "type":
"invalid_request_error", "code", "retryable": false}}`, before `data: [DONE]`; the OpenAI routes
answer `ErrorResponse` — `{"object": "error", "message", "type", "param", "code"}` — which
`OpenAIErrors` writes from the vLLM-shaped answers of the routes they share."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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


def flat(doc: object) -> object:
    """vLLM's `{"error": {message, type, param, code}}` as SGLang's flat `ErrorResponse`."""
    if isinstance(doc, dict) and set(doc) == {"error"} and isinstance(doc["error"], dict):
        e = doc["error"]
        return {"object": "error", "message": e.get("message"), "type": e.get("type"),
                "param": e.get("param"), "code": e.get("code")}
    return doc


class OpenAIErrors:
    """ASGI middleware: a JSON error answer (status ≥ 400) of an OpenAI route (`/v1/`) is
    rewritten in SGLang's flat shape; every other answer passes untouched, unbuffered."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                if message["status"] >= 400 and headers.get(b"content-type", b"").startswith(
                        b"application/json"):
                    start = message
                    return
                await send(message)
            elif start is not None and message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    await _send_flat(start, b"".join(chunks), send)
            else:
                await send(message)

        await self.app(scope, receive, capture)


async def _send_flat(start: Message, raw: bytes, send: Send) -> None:
    try:
        out = json.dumps(flat(json.loads(raw))).encode()
    except ValueError:
        out = raw
    headers = [(k, v) for k, v in start.get("headers") or [] if k != b"content-length"]
    headers.append((b"content-length", str(len(out)).encode()))
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": out})
