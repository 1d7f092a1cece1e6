"""Anthropic's Messages API over the chat machinery, as vLLM serves it
(`vllm/entrypoints/anthropic/serving.py`): a `/v1/messages` request becomes a chat request
(`to_chat`), runs as one (`routes.start_chat`), and its answer is rewritten — a chat
completion into a message (`message`), a chat stream into the Messages API's named events
(`MessageEvents`). docs/HTTP.md lists where this differs from vLLM.

1. `to_chat`: the system prompt (the `system` field, then any `system` messages, joined; Claude
   Code's `x-anthropic-billing-header` block left out, as vLLM does: it changes per request and
   would defeat the prefix cache) first; each message's text blocks become its content, an
   assistant's `tool_use` blocks its `tool_calls`, a user's `tool_result` blocks `tool`
   messages; `max_tokens`, `stop_sequences`, sampling, `tools` (`tool_choice` "any" is chat's
   "required"), `output_config.format` (a JSON schema) carried over. A streamed request asks
   the chat stream for usage on every chunk (the Messages events report it).
2. `message`: the chat answer's text as a `text` block, its calls as `tool_use` blocks;
   `finish_reason` stop / length / tool_calls → `stop_reason` end_turn / max_tokens / tool_use.
3. `MessageEvents` (`messages_stream.py`): message_start (with the prompt's tokens),
   content_block_start / _delta / _stop per text or tool-use block, message_delta (stop
   reason, usage), message_stop.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import ValidationError

from server.http.errors import HttpError, bad_request
from server.http.generate import Framing, named_event
from server.http.messages_protocol import ContentBlock, CountTokensRequest, MessagesRequest
from server.http.protocol import ChatCompletionRequest

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_BILLING = "x-anthropic-billing-header"
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def to_chat(req: MessagesRequest | CountTokensRequest) -> ChatCompletionRequest:
    """The chat request vLLM makes of a Messages request (a 400 if chat refuses it)."""
    messages = _system(req)
    for m in req.messages:
        if m.role != "system":
            messages += _converted(m.role, m.content)
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    if isinstance(req, MessagesRequest):
        body.update({k: v for k, v in (
            ("max_tokens", req.max_tokens), ("max_completion_tokens", req.max_tokens),
            ("stop", req.stop_sequences), ("temperature", req.temperature),
            ("top_p", req.top_p), ("top_k", req.top_k),
            ("kv_transfer_params", req.kv_transfer_params)) if v is not None})
        if req.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        fmt = req.output_config.format if req.output_config else None
        if fmt is not None and fmt.json_schema:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": fmt.type, "schema": fmt.json_schema}}
    if req.tool_choice is not None:
        kind = req.tool_choice.type
        body["tool_choice"] = _CHOICES.get(kind) or {"type": "function",
                                                     "function": {"name": req.tool_choice.name}}
    if req.tools is not None:
        body["tools"] = [{"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.input_schema}}
            for t in req.tools]
        body.setdefault("tool_choice", "auto")
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        raise bad_request(str(e)) from None


def _system(req: MessagesRequest | CountTokensRequest) -> list[dict[str, Any]]:
    """The `system` field, then each `system` message, as one system message."""
    parts: list[str] = []
    given = [req.system] if req.system else []
    for content in [*given, *(m.content for m in req.messages if m.role == "system")]:
        if isinstance(content, str):
            parts.append(content)
        else:
            parts += [b.text for b in content
                      if b.type == "text" and b.text and not b.text.startswith(_BILLING)]
    return [{"role": "system", "content": "".join(parts)}] if parts else []


def _converted(role: str, content: str | list[ContentBlock]) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: the `tool` messages of its tool results, then
    the message itself (a user message with nothing left is dropped, as vLLM drops it)."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for b in content:
        if b.type == "text" and b.text:
            parts.append({"type": "text", "text": b.text})
        elif b.type == "image" and b.source:
            parts.append({"type": "image_url", "image_url": {"url": _image_url(b.source)}})
        elif b.type == "thinking" and b.thinking is not None:
            reasoning.append(b.thinking)
        elif b.type == "tool_use":
            calls.append({"id": b.id or f"call_{int(time.time())}", "type": "function",
                          "function": {"name": b.name or "",
                                       "arguments": json.dumps(b.input or {})}})
        elif b.type == "tool_result":
            if role == "user":
                out += _tool_result(b)
            else:
                text = str(b.content) if b.content else ""
                parts.append({"type": "text", "text": f"Tool result: {text}"})
    msg: dict[str, Any] = {"role": role}
    if reasoning:
        msg["reasoning"] = "".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    if parts:
        only_text = len(parts) == 1 and parts[0]["type"] == "text"
        msg["content"] = parts[0]["text"] if only_text else parts
    if not (role == "user" and "content" not in msg):
        out.append(msg)
    return out


def _tool_result(b: ContentBlock) -> list[dict[str, Any]]:
    """A user's tool result: a `tool` message with its text (its images in a user message
    after it)."""
    items = b.content if isinstance(b.content, list) else []
    text = b.content if isinstance(b.content, str) else "\n".join(
        str(i.get("text", "")) for i in items if i.get("type") == "text")
    out: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": b.tool_use_id or "",
                                  "content": text or ""}]
    images = [_image_url(i.get("source") or {}) for i in items if i.get("type") == "image"]
    if images:
        out.append({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": u}} for u in images]})
    return out


def _image_url(source: dict[str, Any]) -> str:
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the block's `input` (a call cut short by max_tokens: {})."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def message(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat completion as the Messages API's answer (vLLM's `messages_full_converter`,
    written as it dumps it: fields that are None left out)."""
    choice = chat["choices"][0]
    msg = choice["message"]
    content: list[dict[str, Any]] = []
    if msg["content"]:
        content.append({"type": "text", "text": msg["content"]})
    for call in msg.get("tool_calls") or ():
        content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                        "input": _input(call["function"]["arguments"])})
    out: dict[str, Any] = {"id": chat["id"], "type": "message", "role": "assistant",
                           "content": content, "model": chat["model"]}
    reason = STOP_REASONS.get(choice["finish_reason"])
    if reason is not None:
        out["stop_reason"] = reason
    usage = chat["usage"]
    out["usage"] = {"input_tokens": usage["prompt_tokens"],
                    "output_tokens": usage["completion_tokens"]}
    if chat.get("kv_transfer_params") is not None:
        out["kv_transfer_params"] = chat["kv_transfer_params"]
    return out


def error_body(e: HttpError) -> dict[str, Any]:
    """vLLM's `translate_error_response`: the chat error's type and message."""
    return {"type": "error", "error": {"type": e.type, "message": e.message}}


def _stream_error(e: HttpError) -> bytes:
    return named_event({"type": "error", "error": {"type": "internal_error",
                                                   "message": e.message}})


# the Messages API's stream: named events, an `error` event on failure, no closing line
FRAMING = Framing(named_event, _stream_error, b"", error_body)
