"""OpenAI's Responses API over the chat machinery, as vLLM serves it for a plain (not gpt-oss)
model (`vllm/entrypoints/openai/responses/`; its optional store: `responses_store.py`):
a `/v1/responses` request becomes a chat request (`to_chat`), runs as one
(`routes.start_chat`), and its answer is rewritten — a chat completion into a response
(`response`), a chat stream into the Responses API's events (`ResponseEvents`). docs/HTTP.md
lists where this differs from vLLM.

1. `to_chat`: `instructions` as the system message, then the stored conversation a
   `previous_response_id` continues (with `VLLM_ENABLE_RESPONSES_API_STORE=1`:
   `responses_store.py`), then the input (a string is one user
   message; items in order: messages, an earlier `function_call` as the assistant's tool call,
   a `function_call_output` as a `tool` message, a `reasoning` item as the assistant's
   reasoning), as vLLM's `construct_input_messages`; a last assistant message left
   `in_progress` or `incomplete` is continued, not answered. `max_output_tokens` (clamped to
   the context, as vLLM clamps it), sampling, function `tools` (`tool_choice` as chat's),
   `text.format` (a JSON schema) and the logprobs of `include` carried over.
2. `response`: the chat answer's text as a `message` item with one `output_text` part, each
   call as a `function_call` item; `status` "incomplete" (`incomplete_details.reason`
   "max_output_tokens") when the length ran out, else "completed"; the request's settings
   echoed as vLLM's `ResponsesResponse.from_request` echoes them.
3. `ResponseEvents` (`responses_stream.py`): response.created, response.in_progress, each
   item's added / delta / done events, response.completed, numbered by `sequence_number`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from server.http.errors import HttpError, bad_request
from server.http.generate import Framing, named_event
from server.http.protocol import ChatCompletionRequest
from server.http.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputItem,
    MessageItem,
    ResponsesRequest,
)

_TEXT_PARTS = ("input_text", "output_text", "text")


def to_chat(req: ResponsesRequest, max_model_len: int,
            history: Sequence[dict[str, Any]] = ()) -> ChatCompletionRequest:
    """The chat request vLLM makes of a Responses request (a 400 if chat refuses it; a 501
    for `json_object`, which vLLM does not implement); `history`: the stored conversation a
    `previous_response_id` continues (`ResponseStore.history`), after the instructions."""
    messages = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages += list(history)
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
    else:
        messages += [_message(i) for i in req.input]
    body: dict[str, Any] = {"model": req.model, "messages": messages,
                            "priority": req.priority, "user": req.user}
    if _continues(req):
        body.update(add_generation_prompt=False, continue_final_message=True)
    if req.max_output_tokens is not None:
        body["max_tokens"] = min(req.max_output_tokens, max_model_len)
    body.update({k: v for k, v in (("temperature", req.temperature), ("top_p", req.top_p),
                                   ("top_k", req.top_k), ("cache_salt", req.cache_salt),
                                   ("session_id", req.session_id),
                                   ("vllm_xargs", req.vllm_xargs))
                 if v is not None})
    if req.logprobs_included():
        body.update(logprobs=True, top_logprobs=req.top_logprobs or 0)
    if req.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    fmt = req.text.format if req.text else None
    if fmt is not None and fmt.type == "json_object":
        raise HttpError(501, "json_object is not supported", "NotImplementedError")
    if fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.name or "response", "schema": fmt.json_schema, "strict": fmt.strict}}
    if req.tools and req.tool_choice != "none":
        body["tools"] = [{"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in function_tools(req)]
        body["tool_choice"] = _tool_choice(req.tool_choice)
        body["parallel_tool_calls"] = req.parallel_tool_calls
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        raise bad_request(str(e)) from None


def function_tools(req: ResponsesRequest) -> list[FunctionTool]:
    """The request's tools, each a function (a 400 names any other kind: no built-in tool —
    web search, code interpreter, MCP — runs here)."""
    out = []
    for t in req.tools:
        if t.get("type") != "function":
            raise bad_request(f"Tool type {t.get('type')!r} is not supported: only function "
                              "tools are", "tools")
        try:
            out.append(FunctionTool.model_validate(t))
        except ValidationError as e:
            raise bad_request(str(e), "tools") from None
    return out


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request(f"tool_choice {choice!r} is not supported: give none, auto, required "
                      "or {\"type\": \"function\", \"name\": ...}", "tool_choice")


def _continues(req: ResponsesRequest) -> bool:
    """vLLM's `should_continue_final_message`: the input ends with an unfinished answer."""
    last = req.input[-1] if isinstance(req.input, list) and req.input else None
    return (isinstance(last, MessageItem) and last.role == "assistant"
            and last.status in ("in_progress", "incomplete"))


def _message(item: InputItem) -> dict[str, Any]:
    """One input item as a chat message (vLLM's `_construct_single_message_from_response_item`)."""
    if isinstance(item, FunctionCallItem):
        return {"role": "assistant", "tool_calls": [{
            "id": item.call_id, "type": "function",
            "function": {"name": item.name, "arguments": item.arguments}}]}
    if isinstance(item, FunctionCallOutputItem):
        return {"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)}
    if isinstance(item, MessageItem):
        role = "system" if item.role == "developer" else item.role
        return {"role": role, "content": item.content if isinstance(item.content, str)
                else _parts(item.content)}
    if item.encrypted_content:
        raise bad_request("Encrypted content is not supported.", "input")
    texts = item.summary if len(item.summary) == 1 else (item.content or [])[:1]
    return {"role": "assistant", "reasoning": "".join(str(p.get("text", "")) for p in texts)}


def _parts(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Response content parts as chat's: text parts (one alone becomes the content itself),
    `input_image` as an image URL."""
    out: list[dict[str, Any]] = []
    for p in parts:
        if p.get("type") in _TEXT_PARTS:
            out.append({"type": "text", "text": str(p.get("text", ""))})
        elif p.get("type") == "input_image" and p.get("image_url"):
            out.append({"type": "image_url", "image_url": {"url": p["image_url"]}})
        else:
            raise bad_request(f"Content part type {p.get('type')!r} is not supported", "input")
    return out[0]["text"] if len(out) == 1 and out[0]["type"] == "text" else out


def _text(output: str | list[dict[str, Any]]) -> str:
    return output if isinstance(output, str) else "".join(
        str(p.get("text", "")) for p in output if p.get("type") in _TEXT_PARTS)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def text_item(item_id: str, text: str, logprobs: list[dict] | None) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": logprobs}]}


def call_item(item_id: str, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": "completed"}


def shell(req: ResponsesRequest, model: str, created: int, max_tokens: int | None,
          output: list[dict], status: str, usage: dict | None) -> dict[str, Any]:
    """A response object (vLLM's `ResponsesResponse.from_request`, every field dumped)."""
    return {
        "id": req.request_id, "created_at": created,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
        else None,
        "instructions": req.instructions, "metadata": req.metadata, "model": model,
        "object": "response", "output": output, "parallel_tool_calls": req.parallel_tool_calls,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "tool_choice": req.tool_choice,
        "tools": [t.model_dump() for t in function_tools(req)],
        "top_p": 1.0 if req.top_p is None else req.top_p, "background": req.background,
        "max_output_tokens": max_tokens, "max_tool_calls": req.max_tool_calls,
        "previous_response_id": req.previous_response_id, "prompt": None,
        "reasoning": req.reasoning, "service_tier": req.service_tier, "status": status,
        "text": req.text.model_dump(by_alias=True) if req.text else None,
        "top_logprobs": req.top_logprobs if req.logprobs_included() else None,
        "truncation": req.truncation, "usage": usage, "user": req.user,
        "input_messages": None, "output_messages": None}


def usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    """Chat's usage as the Responses API's (vLLM's `ResponseUsage`; no per-turn counts for a
    plain model, as vLLM's `SimpleContext`)."""
    prompt, done = chat_usage["prompt_tokens"], chat_usage["completion_tokens"]
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"input_tokens": prompt, "input_tokens_details": {
                "cached_tokens": cached, "input_tokens_per_turn": [],
                "cached_tokens_per_turn": []},
            "output_tokens": done, "output_tokens_details": {
                "reasoning_tokens": 0, "tool_output_tokens": 0, "output_tokens_per_turn": [],
                "tool_output_tokens_per_turn": []},
            "total_tokens": prompt + done}


def response(req: ResponsesRequest, chat: dict[str, Any], max_model_len: int) -> dict[str, Any]:
    """A chat completion as the Responses API's answer."""
    choice = chat["choices"][0]
    msg = choice["message"]
    output: list[dict] = []
    if msg["content"]:
        lp = choice.get("logprobs")
        output.append(text_item(new_id("msg"), msg["content"],
                                logprobs(lp["content"]) if lp else None))
    output += [call_item(new_id("fc"), c["id"], c["function"]["name"],
                         c["function"]["arguments"]) for c in msg.get("tool_calls") or ()]
    status = "incomplete" if choice["finish_reason"] == "length" else "completed"
    u = chat["usage"]
    out = shell(req, chat["model"], int(time.time()),
                budget(req, u["prompt_tokens"], max_model_len), output, status, usage(u))
    # --enable-per-request-metrics's timings (else omitted, as vLLM); vLLM's Responses answer
    # has no speculative_decoding block
    metrics = {**(chat.get("metrics") or {}), "speculative_decoding": None}
    if any(v is not None for v in metrics.values()):
        out["metrics"] = metrics
    return out


def budget(req: ResponsesRequest, prompt_tokens: int, max_model_len: int) -> int:
    """The output tokens the request was allowed (vLLM echoes its sampling `max_tokens`)."""
    room = max_model_len - prompt_tokens
    return room if req.max_output_tokens is None else min(req.max_output_tokens, room)


def logprobs(content: list[dict[str, Any]], stream: bool = False) -> list[dict[str, Any]]:
    """Chat's logprobs as an `output_text` part's (its deltas' leave out the bytes)."""
    def one(e: dict[str, Any], top: list[dict[str, Any]] | None) -> dict[str, Any]:
        out = {"token": e["token"], "logprob": e["logprob"]}
        if not stream:
            out["bytes"] = e.get("bytes") or list(e["token"].encode())
        if top is not None:
            out["top_logprobs"] = top
        return out
    return [one(e, [one(t, None) for t in e.get("top_logprobs") or ()]) for e in content]


def error_event(e: HttpError, sequence_number: int) -> dict[str, Any]:
    """An engine failure in the middle of a stream: OpenAI's `error` event."""
    return {"type": "error", "code": e.type, "message": e.message, "param": e.param,
            "sequence_number": sequence_number}


def framing(stream_error: Callable[[HttpError], dict[str, Any]]) -> Framing:
    """The Responses API's stream: named events (`event: <type>`), no closing line."""
    return Framing(named_event, lambda e: named_event(stream_error(e)), b"", HttpError.body)
