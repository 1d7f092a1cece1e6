"""Structured output and tool calls over HTTP with the `openai` client: every form vLLM accepts
(plus the guided_* aliases, which vLLM 0.33.0 ignores and doppelchip honours) gives output
that validates; tool calls carry schema-valid arguments, streamed or not."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from fleets import assert_released
from http_helpers import stream_events

MODEL = "llama-3.1-8b"
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 20},
                                  "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object",
                                       "properties": {"zone": {"type": "string",
                                                               "maxLength": 8}},
                                       "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.mark.parametrize("extra", [
    {"response_format": {"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON}}},
    {"structured_outputs": {"json": PERSON}},
    {"guided_json": PERSON},
])
async def test_json_schema_forms_validate(oai, client, extra):
    for seed in range(3):
        r = await oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "a person"}], max_tokens=120,
            seed=seed, extra_body={k: v for k, v in extra.items() if k != "response_format"},
            **({"response_format": extra["response_format"]} if "response_format" in extra
               else {}))
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    await assert_released(client, "fast")


async def test_json_object_is_an_object(oai):
    r = await oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=80,
                                          response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.parametrize("field", ["structured_outputs", "guided"])
async def test_regex_choice_grammar(oai, field):
    def body(kind, value):
        return {"structured_outputs": {kind: value}} if field == "structured_outputs" else {
            f"guided_{kind}": value}

    r = await oai.completions.create(model=MODEL, prompt="phone:", max_tokens=20,
                                     extra_body=body("regex", r"[0-9]{3}-[0-9]{4}"))
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", r.choices[0].text)
    r = await oai.completions.create(model=MODEL, prompt="pick:", max_tokens=20,
                                     extra_body=body("choice", ["red", "green", "blue"]))
    assert r.choices[0].text in ("red", "green", "blue")
    grammar = 'start: "yes" | "no" | "maybe"'
    r = await oai.completions.create(model=MODEL, prompt="answer:", max_tokens=20,
                                     extra_body=body("grammar", grammar))
    assert r.choices[0].text in ("yes", "no", "maybe")


async def test_two_constraints_are_refused(http):
    r = await http.post("/v1/completions", json={
        "prompt": "x", "guided_regex": "a+", "structured_outputs": {"choice": ["a"]}})
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"


def check_calls(calls, tools: list[dict]) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


async def test_required_tool_calls_validate(oai, client):
    for seed in range(3):
        r = await oai.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME],
                                              tool_choice="required", max_tokens=200,
                                              seed=seed)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        check_calls(choice.message.tool_calls, [WEATHER, TIME])
    await assert_released(client, "fast")


async def test_named_tool_call_is_that_tool(oai):
    r = await oai.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], max_tokens=200,
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    choice = r.choices[0]
    assert choice.finish_reason == "stop"  # as vLLM and OpenAI report a forced named tool
    assert [c.function.name for c in choice.message.tool_calls] == ["get_time"]
    check_calls(choice.message.tool_calls, [TIME])


async def test_auto_calls_a_tool_then_answers_its_result(oai):
    first = await oai.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER],
                                              max_tokens=200)
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    check_calls([call], [WEATHER])
    follow = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
              {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    second = await oai.chat.completions.create(model=MODEL, messages=follow, tools=[WEATHER],
                                               max_tokens=20, extra_body={"ignore_eos": True})
    assert not second.choices[0].message.tool_calls
    assert second.choices[0].message.content and second.choices[0].finish_reason == "length"


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}])
async def test_streamed_tool_calls_assemble_to_valid_calls(http, client, choice):
    r, events = await stream_events(http, "/v1/chat/completions", {
        "model": MODEL, "messages": ASK, "tools": [WEATHER, TIME], "tool_choice": choice,
        "max_tokens": 200, "stream": True, "seed": 5})
    assert r.status_code == 200 and events[-1] == "[DONE]"
    calls: dict[int, dict] = {}
    finish = None
    for e in events[:-1]:
        for c in e["choices"]:
            for d in c["delta"].get("tool_calls", []):
                entry = calls.setdefault(d["index"], {"name": None, "args": "", "id": None})
                if "id" in d:
                    entry["id"], entry["name"] = d["id"], d["function"]["name"]
                entry["args"] += d["function"].get("arguments", "")
            finish = c.get("finish_reason") or finish
    assert calls and finish == ("tool_calls" if choice == "required" else "stop")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for entry in calls.values():
        assert entry["id"].startswith("chatcmpl-tool-")
        jsonschema.validate(json.loads(entry["args"]), schemas[entry["name"]])
    await assert_released(client, "fast")


async def test_bad_tool_choice_is_400(http):
    nope = {"type": "function", "function": {"name": "nope"}}
    for tools in ([WEATHER], []):  # (an empty array keeps a named choice's mismatch)
        r = await http.post("/v1/chat/completions", json={
            "messages": ASK, "tools": tools, "tool_choice": nope})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
        assert r.json()["error"]["message"].startswith(
            "The tool `nope` specified in `tool_choice` does not match any of the specified "
            "`tools`")


@pytest.mark.parametrize("choice", [None, "auto", "required", "none"])
async def test_an_empty_tools_array_is_an_omitted_one(http, choice):
    """vLLM 0.34.0, as OpenAI: "auto" and "required" have nothing to call and answer text."""
    body = {"messages": ASK, "tools": [], "max_tokens": 4,
            **({"tool_choice": choice} if choice else {})}
    r = await http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    (c,) = r.json()["choices"]
    assert not c["message"].get("tool_calls") and c["finish_reason"] == "length"


async def test_an_empty_tools_array_is_an_omitted_one_on_the_messages_route(http):
    r = await http.post("/v1/messages", json={"model": MODEL, "max_tokens": 4, "tools": [],
                                              "messages": ASK})
    assert r.status_code == 200, r.text
    assert r.json()["stop_reason"] == "max_tokens"
