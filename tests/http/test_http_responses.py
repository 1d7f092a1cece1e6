"""OpenAI's Responses API (`/v1/responses`) through the official `openai` client against
doppelchip's own HTTP: the same answer as the chat request vLLM makes of it, the streamed
events in order (and the SDK's own accumulator rebuilding the answer), function calls and
their outputs, structured output, vLLM's store-less refusals, and every request's KV returned
however it ends."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from fleets import assert_released
from http_helpers import named_events

MODEL = "llama-3.1-8b"  # the test fleet's default deployment ("fast") serves it
INSTRUCTIONS = "You answer briefly."
ASK = "Name a colour."
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


async def as_chat(oai: openai.AsyncOpenAI, max_tokens: int):
    """The chat request vLLM turns the Responses request of these tests into."""
    return await oai.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": INSTRUCTIONS},
                               {"role": "user", "content": ASK}], max_tokens=max_tokens)


@pytest.mark.parametrize(("max_tokens", "status"), [(6, "incomplete"), (200, "completed")])
async def test_a_response_is_the_chat_answer_rewritten(oai, client, max_tokens, status):
    # (the mock model is seeded: this prompt's answer ends by itself within 200 tokens)
    r = await oai.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=ASK,
                                   max_output_tokens=max_tokens)
    chat = await as_chat(oai, max_tokens)
    choice = chat.choices[0]
    assert r.object == "response" and r.model == MODEL and r.id.startswith("resp_")
    assert r.status == status
    assert choice.finish_reason == {"incomplete": "length", "completed": "stop"}[status]
    assert (r.incomplete_details.reason if r.incomplete_details else None) == (
        "max_output_tokens" if status == "incomplete" else None)
    assert [i.type for i in r.output] == ["message"]
    assert r.output[0].id.startswith("msg_") and r.output[0].role == "assistant"
    assert r.output_text == choice.message.content  # the same mock model, same context
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.max_output_tokens == max_tokens and r.instructions == INSTRUCTIONS
    await assert_released(client, "fast")


async def test_message_items_are_the_same_conversation_as_a_string(oai):
    as_string = await oai.responses.create(model=MODEL, input=ASK, max_output_tokens=12)
    as_items = await oai.responses.create(
        model=MODEL, max_output_tokens=12,
        input=[{"role": "user", "content": [{"type": "input_text", "text": ASK}]}])
    assert as_items.output_text == as_string.output_text
    assert as_items.usage.input_tokens == as_string.usage.input_tokens
    # an assistant answer left in progress is continued, not answered (vLLM's rule)
    cont = await oai.responses.create(model=MODEL, max_output_tokens=4, input=[
        {"role": "user", "content": ASK},
        {"type": "message", "role": "assistant", "status": "in_progress",
         "content": [{"type": "output_text", "text": "Blue and"}]}])
    done = await oai.responses.create(model=MODEL, max_output_tokens=4, input=[
        {"role": "user", "content": ASK},
        {"type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Blue and"}]}])
    assert cont.usage.input_tokens < done.usage.input_tokens  # no new assistant turn opened


async def test_the_stream_is_the_responses_events_in_order(oai, http, client):
    whole = await oai.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=ASK,
                                       max_output_tokens=24)
    stream = await oai.responses.create(model=MODEL, instructions=INSTRUCTIONS, input=ASK,
                                        max_output_tokens=24, stream=True)
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    item_id = events[2].item.id
    assert {e.item_id for e in events[3:-2]} == {item_id}
    text = "".join(e.delta for e in events[4:-4])
    assert text == events[-4].text == whole.output_text
    done = events[-1].response
    assert done.status == whole.status and done.output[0].id == item_id
    assert done.output_text == whole.output_text
    assert (done.usage.input_tokens, done.usage.output_tokens) == (
        whole.usage.input_tokens, whole.usage.output_tokens)
    # the SDK's own accumulator (what agents read) rebuilds the same response from the events
    async with oai.responses.stream(model=MODEL, instructions=INSTRUCTIONS, input=ASK,
                                    max_output_tokens=24) as helper:
        final = await helper.get_final_response()
    assert final.output_text == whole.output_text
    wire = await named_events(http, "/v1/responses", {
        "model": MODEL, "input": ASK, "max_output_tokens": 5, "stream": True})
    assert wire[-1]["type"] == "response.completed"
    await assert_released(client, "fast")


async def test_a_function_is_called_then_its_output_answered(oai, client):
    r = await oai.responses.create(model=MODEL, input=ASK, max_output_tokens=200,
                                   tools=[WEATHER], tool_choice="required")
    calls = [i for i in r.output if i.type == "function_call"]
    assert calls and all(c.name == "get_weather" and c.call_id and c.id.startswith("fc_")
                         for c in calls)
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), WEATHER["parameters"])
    assert r.tools[0].name == "get_weather" and r.tool_choice == "required"
    # the agent loop's next turn: the call and its output sent back, answered in text
    follow = await oai.responses.create(model=MODEL, max_output_tokens=8, tools=[WEATHER],
                                        input=[{"role": "user", "content": ASK},
                                               calls[0].model_dump(),
                                               {"type": "function_call_output",
                                                "call_id": calls[0].call_id,
                                                "output": "Sunny, 21 C"}])
    assert [i.type for i in follow.output] == ["message"]
    assert follow.usage.input_tokens > r.usage.input_tokens  # the call and output were read
    await assert_released(client, "fast")


async def test_a_streamed_call_arrives_as_argument_deltas(oai, client):
    named = {"type": "function", "name": "get_weather"}
    stream = await oai.responses.create(model=MODEL, input=ASK, max_output_tokens=200,
                                        tools=[WEATHER], tool_choice=named, stream=True)
    events = [e async for e in stream]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [a.item.type for a in added] == ["function_call"]
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    jsonschema.validate(json.loads(args), WEATHER["parameters"])
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [d.arguments for d in done] == [args] and done[0].item_id == added[0].item.id
    final = events[-1].response
    assert final.output[0].arguments == args and final.output[0].call_id == added[0].item.call_id
    async with oai.responses.stream(model=MODEL, input=ASK, max_output_tokens=200,
                                    tools=[WEATHER], tool_choice=named) as helper:
        accumulated = await helper.get_final_response()
    assert accumulated.output[0].type == "function_call"
    assert json.loads(accumulated.output[0].arguments) == json.loads(args)
    await assert_released(client, "fast")


async def test_a_json_schema_format_constrains_the_output(oai, client):
    schema = {"type": "object", "properties": {"colour": {"type": "string"}},
              "required": ["colour"], "additionalProperties": False}
    r = await oai.responses.create(model=MODEL, input=ASK, max_output_tokens=200, text={
        "format": {"type": "json_schema", "name": "colour", "schema": schema, "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"
    await assert_released(client, "fast")


async def test_logprobs_come_when_included(oai):
    r = await oai.responses.create(model=MODEL, input=ASK, max_output_tokens=5, top_logprobs=2,
                                   include=["message.output_text.logprobs"])
    part = r.output[0].content[0]
    assert len(part.logprobs) == r.usage.output_tokens
    assert "".join(lp.token for lp in part.logprobs) == part.text
    assert all(len(lp.top_logprobs) == 2 for lp in part.logprobs)
    plain = await oai.responses.create(model=MODEL, input=ASK, max_output_tokens=5)
    assert plain.output[0].content[0].logprobs is None


async def test_store_less_refusals_are_vllms(oai, http, client):
    with pytest.raises(openai.NotFoundError) as e:
        await oai.responses.create(model=MODEL, input=ASK, previous_response_id="resp_abc")
    assert e.value.body["message"] == "Response with id 'resp_abc' not found."
    assert e.value.body["param"] == "response_id"
    for r in (await http.get("/v1/responses/resp_abc"),
              await http.post("/v1/responses/resp_abc/cancel")):
        assert r.status_code == 404 and "resp_abc" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError) as e:
        await oai.responses.create(model=MODEL, input=ASK, background=True)
    assert "VLLM_ENABLE_RESPONSES_API_STORE" in e.value.body["message"]
    r = await http.post("/v1/responses", json={"model": MODEL, "input": ASK,
                                               "background": True, "store": False})
    assert r.status_code == 400 and "only be used when `store`" in r.json()["error"]["message"]
    # store=true (the default) is served, not stored: the id names nothing afterwards
    made = await oai.responses.create(model=MODEL, input=ASK, max_output_tokens=3, store=True)
    assert (await http.get(f"/v1/responses/{made.id}")).status_code == 404
    await assert_released(client, "fast")


async def test_bad_input_is_refused_by_name_and_frees_everything(oai, http, client):
    with pytest.raises(openai.NotFoundError):
        await oai.responses.create(model="no-such-model", input=ASK)
    bad = {
        "a web search tool": ({"tools": [{"type": "web_search_preview"}]}, 400, "tools"),
        "JSON mode": ({"text": {"format": {"type": "json_object"}}}, 501, "json_object"),
        "a prompt template": ({"prompt": {"id": "pmpt_1"}}, 400, "prompt template"),
        "no input": ({"input": None}, 400, "input"),
        "a call without its name": ({"input": [{"type": "function_call", "call_id": "c",
                                                "arguments": "{}"}]}, 400, "name"),
        "an empty cache salt": ({"cache_salt": ""}, 400, "cache_salt"),
        "a prompt past the context": ({"input": "word " * 5000}, 400, "context"),
    }
    for what, (fields, status, words) in bad.items():
        r = await http.post("/v1/responses", json={"model": MODEL, "input": ASK, **fields})
        assert r.status_code == status, what
        assert words in json.dumps(r.json()["error"]), what
    await assert_released(client, "fast")



async def test_the_id_is_the_bodys_request_id_else_a_new_one_each_time(http):
    same = {"X-Request-Id": "client-chosen"}
    ids = []
    for _ in range(2):
        r = await http.post("/v1/responses", headers=same,
                            json={"model": MODEL, "input": ASK, "max_output_tokens": 2})
        assert r.status_code == 200 and r.headers["x-request-id"] == "client-chosen"
        ids.append(r.json()["id"])
    assert ids[0] != ids[1] and all(i.startswith("resp_") for i in ids)  # vLLM's resp_<uuid>
    r = await http.post("/v1/responses", json={"model": MODEL, "input": ASK,
                                               "max_output_tokens": 2, "request_id": "mine"})
    assert r.json()["id"] == "mine"
