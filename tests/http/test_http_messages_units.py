"""The Messages API's pieces without a server: the chat request a Messages request becomes
(`server.http.messages.to_chat`, vLLM's `_convert_anthropic_to_openai_request`) and the error
event a stream ends with when its engine dies."""

from __future__ import annotations

import json

from http_helpers import DyingStream, WatchedRun

from server.http.generate import Choice, sse
from server.http.messages import FRAMING, message, to_chat
from server.http.messages_protocol import CountTokensRequest, MessagesRequest


def chat_of(**body):
    return to_chat(MessagesRequest.model_validate({"model": "m", "max_tokens": 9, **body}))


def test_system_parts_join_in_order_without_the_billing_header():
    req = chat_of(system=[{"type": "text", "text": "x-anthropic-billing-header: cc=1f3a;"},
                          {"type": "text", "text": "Be brief. "}],
                  messages=[{"role": "system", "content": "Be kind."},
                            {"role": "ctx", "content": "Hi"}])  # Claude Code's role: user
    assert [(m.role, m.content) for m in req.messages] == [
        ("system", "Be brief. Be kind."), ("user", "Hi")]
    assert req.max_tokens == req.max_completion_tokens == 9


def test_tool_use_and_tool_results_become_calls_and_tool_messages():
    req = chat_of(messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "Rain"}, {"type": "text", "text": "9 C"}]},
            {"type": "text", "text": "And tomorrow?"}]}],
        tools=[{"name": "get_weather", "input_schema": {"properties": {}}}],
        tool_choice={"type": "any"})
    roles = [m.role for m in req.messages]
    assert roles == ["user", "assistant", "tool", "user"]  # the result before the new text
    call = req.messages[1].tool_calls[0]
    assert call["id"] == "toolu_1" and json.loads(call["function"]["arguments"]) == {
        "city": "Oslo"}
    assert req.messages[1].content == "Let me look."
    assert (req.messages[2].tool_call_id, req.messages[2].content) == ("toolu_1", "Rain\n9 C")
    assert req.messages[3].content == "And tomorrow?"
    assert req.tool_choice == "required"  # Anthropic's "any"
    assert req.tools[0].function.parameters == {"properties": {}, "type": "object"}


def test_tools_default_to_auto_and_a_named_tool_is_chat_s_named_choice():
    assert chat_of(messages=[{"role": "user", "content": "x"}],
                   tools=[{"name": "f", "input_schema": {}}]).tool_choice == "auto"
    named = chat_of(messages=[{"role": "user", "content": "x"}],
                    tools=[{"name": "f", "input_schema": {}}],
                    tool_choice={"type": "tool", "name": "f"})
    assert named.tool_choice.function.name == "f"


def test_streaming_asks_for_usage_on_every_chunk_and_a_schema_becomes_a_response_format():
    req = chat_of(messages=[{"role": "user", "content": "x"}], stream=True, stop_sequences=["."],
                  output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}})
    assert req.stream and req.stream_options.usage_each and req.stop == ["."]
    assert req.response_format.json_schema.json_schema == {"type": "object"}
    counted = to_chat(CountTokensRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}]}))
    assert counted.max_tokens is None and not counted.stream


def test_a_cut_tool_call_has_empty_input_and_each_finish_its_stop_reason():
    chat = {"id": "chatcmpl-1", "model": "m", "usage": {"prompt_tokens": 3,
                                                          "completion_tokens": 2},
            "choices": [{"finish_reason": "length", "message": {"content": "", "tool_calls": [
                {"id": "c", "function": {"name": "f", "arguments": '{"ci'}}]}}]}
    m = message(chat)
    assert m["content"] == [{"type": "tool_use", "id": "c", "name": "f", "input": {}}]
    assert m["stop_reason"] == "max_tokens" and "stop_sequence" not in m
    chat["choices"][0]["finish_reason"] = "abort"  # no Messages equivalent: left out (vLLM)
    assert "stop_reason" not in message(chat)


async def test_an_engine_death_mid_stream_is_an_error_event_and_nothing_after_it():
    run = WatchedRun(None, [DyingStream()], [Choice(0, 0, 0)], [3])  # type: ignore[arg-type]
    events = [e async for e in sse(run, lambda c, chunk: [{"type": "ping"}], [], list,
                                   FRAMING)]
    assert events[0] == b'event: ping\ndata: {"type":"ping"}\n\n'
    name, data = events[-1].decode().strip().split("\n")
    assert name == "event: error" and len(events) == 2  # no message_stop, no [DONE]
    assert json.loads(data.removeprefix("data: ")) == {"type": "error", "error": {
        "type": "internal_error", "message": "engine process for deployment 'fast' died"}}
    assert run.aborted
