"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) through the official
`anthropic` client against doppelchip's own HTTP: the same answer as the chat request vLLM
makes of it, the streamed events in order, tool use, token counts, errors in the API's shape,
and every request's KV returned however it ends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anthropic
import jsonschema
import openai
import pytest
from fleets import assert_released
from http_helpers import named_events

MODEL = "llama-3.1-8b"  # the test fleet's default deployment ("fast") serves it
SYSTEM = "You answer briefly."
ASK = [{"role": "user", "content": "Name a colour."}]
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}


@pytest.fixture
async def claude(server) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=server.http_url, api_key="none",
                                        max_retries=0, timeout=30) as c:
        yield c


async def as_chat(oai: openai.AsyncOpenAI, max_tokens: int):
    """The chat request vLLM turns the Messages request of these tests into."""
    return await oai.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": SYSTEM}, *ASK],
        max_tokens=max_tokens)


@pytest.mark.parametrize(("max_tokens", "stop_reason"), [(6, "max_tokens"), (200, "end_turn")])
async def test_a_message_is_the_chat_answer_rewritten(claude, oai, client, max_tokens,
                                                      stop_reason):
    # (the mock model is seeded: this prompt's answer ends by itself within 200 tokens)
    m = await claude.messages.create(model=MODEL, system=SYSTEM, messages=ASK,
                                     max_tokens=max_tokens)
    chat = await as_chat(oai, max_tokens)
    choice = chat.choices[0]
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert m.id.startswith("chatcmpl-")  # vLLM's: the chat request's id
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == choice.message.content  # the same mock model, same context
    assert m.stop_reason == stop_reason
    assert choice.finish_reason == {"max_tokens": "length", "end_turn": "stop"}[stop_reason]
    assert m.usage.input_tokens == chat.usage.prompt_tokens
    assert m.usage.output_tokens == chat.usage.completion_tokens
    await assert_released(client, "fast")


async def test_the_stream_is_the_messages_events_in_order(claude, http, client):
    whole = await claude.messages.create(model=MODEL, system=SYSTEM, messages=ASK, max_tokens=24)
    stream = await claude.messages.create(model=MODEL, system=SYSTEM, messages=ASK,
                                          max_tokens=24, stream=True)
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert events[0].message.usage.input_tokens == whole.usage.input_tokens
    assert events[0].message.usage.output_tokens == 0
    assert "".join(e.delta.text for e in events[2:-3]) == whole.content[0].text
    assert events[-2].delta.stop_reason == whole.stop_reason
    assert events[-2].usage.output_tokens == whole.usage.output_tokens
    # the SDK's own accumulator (what agents read) rebuilds the same message from the events
    async with claude.messages.stream(model=MODEL, system=SYSTEM, messages=ASK,
                                      max_tokens=24) as helper:
        final = await helper.get_final_message()
    assert final.content[0].text == whole.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason,
                                                              whole.usage.output_tokens)
    wire = await named_events(http, "/v1/messages", {
        "model": MODEL, "system": SYSTEM, "messages": ASK, "max_tokens": 5, "stream": True})
    assert wire[-1]["type"] == "message_stop"
    await assert_released(client, "fast")


async def test_count_tokens_is_the_prompt_the_message_runs(claude):
    count = await claude.messages.count_tokens(model=MODEL, system=SYSTEM, messages=ASK)
    m = await claude.messages.create(model=MODEL, system=SYSTEM, messages=ASK, max_tokens=2)
    assert count.input_tokens == m.usage.input_tokens > 0
    longer = await claude.messages.count_tokens(model=MODEL, system=SYSTEM * 20, messages=ASK)
    assert longer.input_tokens > count.input_tokens


async def test_a_tool_is_called_then_its_result_answered(claude, client):
    m = await claude.messages.create(model=MODEL, messages=ASK, max_tokens=200,
                                     tools=[WEATHER], tool_choice={"type": "any"})
    assert m.stop_reason == "tool_use"
    calls = [b for b in m.content if b.type == "tool_use"]
    assert calls and all(b.name == "get_weather" and b.id for b in calls)
    for b in calls:
        jsonschema.validate(b.input, WEATHER["input_schema"])
    # the agent loop's next turn: the call and its result sent back, answered in text
    # (auto: after a tool result the model answers, server.http.tools)
    follow = await claude.messages.create(model=MODEL, max_tokens=8, tools=[WEATHER], messages=[
        *ASK, {"role": "assistant", "content": [b.model_dump() for b in calls]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                      "content": "Sunny, 21 C"}]}])
    assert [b.type for b in follow.content] == ["text"]
    assert follow.stop_reason in ("max_tokens", "end_turn")
    await assert_released(client, "fast")


async def test_a_streamed_tool_call_arrives_as_input_json(claude, client):
    stream = await claude.messages.create(model=MODEL, messages=ASK, max_tokens=200,
                                          tools=[WEATHER], stream=True,
                                          tool_choice={"type": "tool", "name": "get_weather"})
    events = [e async for e in stream]
    starts = [e for e in events if e.type == "content_block_start"]
    assert [s.content_block.type for s in starts] == ["tool_use"]
    assert starts[0].content_block.name == "get_weather"
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta")
    jsonschema.validate(json.loads(partial), WEATHER["input_schema"])
    assert events[-2].type == "message_delta"
    async with claude.messages.stream(model=MODEL, messages=ASK, max_tokens=200,
                                      tools=[WEATHER],
                                      tool_choice={"type": "tool", "name": "get_weather"}) as h:
        final = await h.get_final_message()  # the SDK parses the streamed arguments itself
    assert [b.type for b in final.content] == ["tool_use"]
    assert final.content[0].input == json.loads(partial)
    await assert_released(client, "fast")


async def test_errors_come_in_the_messages_shape_and_free_everything(claude, http, client):
    with pytest.raises(anthropic.NotFoundError) as e:
        await claude.messages.create(model="no-such-model", messages=ASK, max_tokens=4)
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "NotFoundError"
    too_long = [{"role": "user", "content": "word " * 5000}]  # past the test fleet's context
    r = await http.post("/v1/messages", json={"model": MODEL, "messages": too_long,
                                              "max_tokens": 4})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "context" in r.json()["error"]["message"]
    # a malformed body is every route's 400 (vLLM's validation handler), not the API's shape
    r = await http.post("/v1/messages", json={"model": MODEL, "messages": ASK, "max_tokens": 0})
    assert r.status_code == 400 and "max_tokens must be positive" in r.json()["error"]["message"]
    r = await http.post("/v1/messages", json={"model": MODEL, "messages": ASK})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    # vLLM 0.34.0: an Anthropic-defined tool is refused by its type; "custom" is a tool
    web = {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}
    r = await http.post("/v1/messages", json={"model": MODEL, "messages": ASK,
                                              "max_tokens": 4, "tools": [web]})
    assert r.status_code == 400 and ("tool type 'web_search_20250305' is not supported; only "
                                     "custom tools with an input_schema are supported"
                                     ) in r.json()["error"]["message"]
    r = await http.post("/v1/messages", json={"model": MODEL, "messages": ASK,
                                              "max_tokens": 4,
                                              "tools": [{**WEATHER, "type": "custom"}]})
    assert r.status_code == 200, r.text
    await assert_released(client, "fast")

