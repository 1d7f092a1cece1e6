"""SageMaker's `/invocations` as vLLM serves it: a chat body answered as chat, a completions body
as completions (streamed too), the adapter header naming the model, and vLLM's refusals."""

from __future__ import annotations

import json

from fleets import assert_released

MODEL = "llama-3.1-8b"  # the test fleet's default deployment ("fast") serves it
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
COMPLETION = {"model": MODEL, "prompt": "Hi", "max_tokens": 5}


async def test_each_body_is_answered_by_the_route_it_belongs_to(http, client):
    for body, route, obj in ((CHAT, "/v1/chat/completions", "chat.completion"),
                             (COMPLETION, "/v1/completions", "text_completion")):
        via = await http.post("/invocations", json=body)
        direct = await http.post(route, json=body)
        assert via.status_code == 200 and via.json()["object"] == obj
        assert via.json()["choices"][0].get("text") == direct.json()["choices"][0].get("text")
        assert via.json()["choices"][0].get("message") == direct.json()["choices"][0].get(
            "message")  # the same seeded mock model: the same answer
        assert via.json()["usage"] == direct.json()["usage"]
    async with http.stream("POST", "/invocations", json={**COMPLETION, "stream": True}) as r:
        lines = [line async for line in r.aiter_lines() if line]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[0].removeprefix("data: "))["object"] == "text_completion"
    await assert_released(client, "fast")


async def test_the_adapter_header_names_the_model(http, client):
    r = await http.post("/invocations", json=COMPLETION,
                        headers={"X-Amzn-SageMaker-Adapter-Identifier": "llama-3.1-70b"})
    assert r.status_code == 200 and r.json()["model"] == "llama-3.1-70b"  # the slow deployment
    r = await http.post("/invocations", json=COMPLETION,
                        headers={"X-Amzn-SageMaker-Adapter-Identifier": "no-such-adapter"})
    assert r.status_code == 404 and "no-such-adapter" in r.json()["error"]["message"]
    await assert_released(client, "slow")


async def test_refusals_are_vllms(http, client):
    r = await http.post("/invocations", json=["neither", "kind"])
    assert r.status_code == 400
    assert r.json()["error"]["message"] == ("Cannot find suitable handler for request. Expected "
                                            "one of: ['ChatCompletionRequest', "
                                            "'CompletionRequest']")
    # not chat, and the completions request's own check refuses it before its fields (vLLM's
    # VLLMValidationError is no pydantic error: it answers, as there)
    r = await http.post("/invocations", json={"model": MODEL, "input": "a Responses body"})
    assert r.status_code == 400 and "prompt or prompt_embeds" in r.json()["error"]["message"]
    r = await http.post("/invocations", content=b"{not json",
                        headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "JSON decode error" in r.json()["error"]["message"]
    r = await http.post("/invocations", content=json.dumps(CHAT).encode(),
                        headers={"Content-Type": "text/plain"})
    assert r.status_code == 400 and "Unsupported Media Type" in r.json()["error"]["message"]
    # a vLLM check inside the chat request's own validation is chat's 400, not a fall-through
    r = await http.post("/invocations", json={**CHAT, "stream_options": {"include_usage": True}})
    assert r.status_code == 400 and "stream=True" in r.json()["error"]["message"]
    await assert_released(client, "fast")


async def test_json_nested_past_the_decoder_is_a_400(http):
    r = await http.post("/invocations", content=b"[" * 100_000,
                        headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "There was an error parsing the body"  # FastAPI's
