"""Unit tests of the Responses API's conversion into a chat request
(`server.http.responses.to_chat`, vLLM's `construct_input_messages`), of its stream's error
event (`ResponseEvents.error` through `generate.sse`) and of the response store's bounds."""

from __future__ import annotations

import asyncio
import json

import pytest
from http_helpers import DyingStream, WatchedRun

from server.engine.tokenizer import get_tokenizer
from server.http import tools
from server.http.chat import ChatShapes
from server.http.errors import HttpError
from server.http.generate import Choice, sse
from server.http.responses import framing, to_chat
from server.http.responses_protocol import ResponsesRequest
from server.http.responses_store import ENV, ResponseStore
from server.http.responses_stream import ResponseEvents

CONTEXT = 4096


def chat_of(**fields):
    return to_chat(ResponsesRequest.model_validate({"model": "m", **fields}), CONTEXT)


def test_items_become_vllms_chat_messages_in_order():
    chat = chat_of(instructions="Be brief.", input=[
        {"role": "developer", "content": "Use metric units."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"},
                                     {"type": "input_image", "image_url": "data:x"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "look it up"}]},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"a":1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ])
    got = [m.model_dump(exclude_none=True) for m in chat.messages]
    assert got == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use metric units."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"},
                                     {"type": "image_url", "image_url": {"url": "data:x"}}]},
        {"role": "assistant", "reasoning": "look it up"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "w", "arguments": '{"a":1}'}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
    assert chat.add_generation_prompt and not chat.continue_final_message


def test_encrypted_reasoning_is_refused_as_vllm_refuses_it():
    with pytest.raises(HttpError) as e:
        chat_of(input=[{"type": "reasoning", "summary": [], "encrypted_content": "xyz"}])
    assert e.value.status == 400 and "Encrypted content" in e.value.message


def test_tools_choices_and_budget_carry_over():
    weather = {"type": "function", "name": "w", "parameters": {"type": "object"}}
    named = chat_of(input="hi", tools=[weather], tool_choice={"type": "function", "name": "w"},
                    max_output_tokens=10 * CONTEXT, parallel_tool_calls=False)
    assert named.tools[0].function.name == "w"
    assert named.tool_choice.function.name == "w" and named.parallel_tool_calls is False
    assert named.max_tokens == CONTEXT  # clamped to the context, as vLLM clamps it
    none = chat_of(input="hi", tools=[weather], tool_choice="none")
    assert none.tools is None  # vLLM renders no tools for tool_choice "none"
    streamed = chat_of(input="hi", stream=True, include=["message.output_text.logprobs"],
                       top_logprobs=3)
    assert streamed.stream and streamed.stream_options.include_usage
    assert streamed.logprobs and streamed.top_logprobs == 3


async def test_an_engine_death_mid_stream_is_an_error_event_in_sequence():
    req = ResponsesRequest.model_validate({"model": "m", "input": "hi", "stream": True})
    chat = to_chat(req, CONTEXT)
    run = WatchedRun(None, [DyingStream()], [Choice(0, 0, 0)], [3])  # type: ignore[arg-type]
    shapes = ChatShapes(chat, run, "chatcmpl-x", "m", get_tokenizer(), tools.plan(chat), [1])
    events = ResponseEvents(req, shapes, CONTEXT)
    out = [e async for e in sse(run, events.chunks, events.head(), events.tail,
                                framing(events.error))]
    lines = [e.decode().strip().split("\n") for e in out]
    names = [name.removeprefix("event: ") for name, _ in lines]
    assert names == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "error"]
    error = json.loads(lines[-1][1].removeprefix("data: "))
    assert error == {"type": "error", "code": "InternalServerError",
                     "message": "engine process for deployment 'fast' died", "param": None,
                     "sequence_number": 5}  # numbered after the events before it
    assert run.aborted


def _stored(rid: str, status: str = "completed", text: str = "hi") -> dict:
    return {"id": rid, "status": status, "output": [
        {"type": "message", "content": [{"type": "output_text", "text": text}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]}


async def test_the_store_keeps_at_most_its_capacity_but_never_drops_a_running_response():
    store = ResponseStore(capacity=2)
    running = asyncio.get_running_loop().create_future()
    store.put(_stored("a", "queued"), [{"role": "user", "content": "A"}])
    task = asyncio.create_task(asyncio.wait_for(running, None))
    store.run("a", task)
    for rid in "bcd":
        store.put(_stored(rid), [{"role": "user", "content": rid}])
    assert list(store.responses) == ["a", "d"]  # b, c dropped, oldest first; a still runs
    assert set(store.messages) == {"a", "d"}
    running.set_result(None)
    await task  # (the store's done callback, registered first, has run)
    store.put(_stored("e"))
    assert list(store.responses) == ["d", "e"]


def test_a_cancelled_response_stays_cancelled_and_history_is_the_text_only():
    store = ResponseStore()
    store.put(_stored("r", "cancelled"), [{"role": "user", "content": "Q"}])
    store.put(_stored("r", "completed", "late"))
    assert store.get("r")["status"] == "cancelled"
    assert store.history("r") == [{"role": "user", "content": "Q"},
                                  {"role": "assistant", "content": "hi"}]  # (no call: vLLM's)


def test_the_store_is_on_only_when_vllms_variable_asks(monkeypatch):
    for value, on in (("1", True), ("0", False), ("", False)):
        monkeypatch.setenv(ENV, value)
        assert (ResponseStore.from_env() is not None) == on
    monkeypatch.delenv(ENV)
    assert ResponseStore.from_env() is None


def test_the_store_is_bounded_in_text_and_in_kept_streams_too():
    # (each `_stored` answer holds its text and a call's two characters of arguments)
    store = ResponseStore(max_chars=100, event_logs=1)
    store.put(_stored("a", text="x" * 40), [{"role": "user", "content": "q" * 20}])  # 62
    store.put(_stored("b", text="y" * 30))  # 32: 94, both kept
    assert list(store.responses) == ["a", "b"] and store.total_chars == 94
    store.put(_stored("c", text="z" * 20), [{"role": "user", "content": [
        {"type": "text", "text": "w" * 10}]}])  # 32: 126, so a goes
    assert list(store.responses) == ["b", "c"] and store.total_chars == 64
    store.put(_stored("c", text="z" * 25))  # an update replaces its own count
    assert store.total_chars == 69 and store.chars["c"] == 37
    store.open_events("b")
    store.open_events("c")  # one stream's events kept: the older goes
    assert list(store.events) == ["c"]
