"""The flat OpenAI `ErrorResponse` SGLang's and TensorRT-LLM's servers answer on their OpenAI
routes — `{"object": "error", "message", "type", "param", "code"}` (sglang 0.5.23
`entrypoints/openai/protocol.py`, TensorRT-LLM 1.3 `serve/openai_protocol.py`) — written from
the vLLM-shaped answers (`{"error": {...}}`) of the route handlers all pods share."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


def flat(doc: object) -> object:
    """vLLM's `{"error": {message, type, param, code}}` as the flat `ErrorResponse`."""
    if isinstance(doc, dict) and set(doc) == {"error"} and isinstance(doc["error"], dict):
        e = doc["error"]
        return {"object": "error", "message": e.get("message"), "type": e.get("type"),
                "param": e.get("param"), "code": e.get("code")}
    return doc


class OpenAIErrors:
    """ASGI middleware: a JSON error answer (status ≥ 400) of an OpenAI route (`/v1/`) is
    rewritten in the flat shape; every other answer passes untouched, unbuffered."""

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
