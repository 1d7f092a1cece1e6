"""vLLM's scale-out routes with `--enable-scale-out`: render answers the token ids the chat and
completions routes run and vLLM's serialized `SamplingParams`; generating from a rendered
request gives the tokens `/v1/chat/completions` gives (the RL round trip), JSON, SSE and text;
`/inference/v1/abort_requests` ends a generation and frees it; bad input gets vLLM's errors.
Without the flag every scale-out route is vLLM's 403."""

from __future__ import annotations

import json

import httpx
import pytest
from fleets import TEST_FLEET, assert_released
from http_helpers import first_data, http_client
from server_proc import ServerProcess

from clients.client import AsyncClient
from server.http.scale_out import DERENDER, DISABLED, RENDER, TOKENS

MODEL = "llama-3.1-8b"  # the test fleet's default deployment ("fast"), max_model_len 256
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def scale_out():
    with ServerProcess(TEST_FLEET, "--enable-scale-out") as s:
        yield s


@pytest.fixture
async def h(scale_out):
    async with http_client(scale_out) as c:
        yield c


@pytest.fixture
async def grpc_client(scale_out):
    async with AsyncClient(scale_out.target) as c:
        yield c


async def test_render_chat_is_the_prompt_the_chat_route_runs(h):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "temperature": 0.5,
            "stop": ["xy"], "seed": 3}
    r = await h.post("/v1/chat/completions/render", json=body,
                     headers={"X-Request-Id": "rendered"})
    assert r.status_code == 200, r.text
    g = r.json()
    tokens = (await h.post("/tokenize", json={"model": MODEL, "messages": MESSAGES})).json()
    assert g["token_ids"] == tokens["tokens"]
    assert g["request_id"] == "chatcmpl-rendered" and g["model"] == MODEL
    # vLLM's SamplingParams as it serializes: the fields that differ from their defaults
    assert g["sampling_params"] == {
        "temperature": 0.5, "seed": 3, "stop": ["xy"], "stop_token_ids": [], "max_tokens": 8,
        "output_kind": 2, "skip_clone": True, "output_text_buffer_length": 1,
        "bad_words": [], "skip_reading_prefix_cache": False}
    assert g["parse_context"]["tool_choice"] == "none" and g["output_mode"] == "tokens"
    # no max_tokens: what the context leaves, as vLLM's get_max_tokens
    r = await h.post("/v1/chat/completions/render", json={"messages": MESSAGES,
                                                          "temperature": 0})
    params = r.json()["sampling_params"]
    assert params["max_tokens"] == tokens["max_model_len"] - len(tokens["tokens"])
    assert params["temperature"] == 0.0 and "top_p" not in params  # greedy
    # a max_tokens equal to SamplingParams' default is kept, last (vLLM 0.34.0's
    # GenerateRequest serializer), so a generate reads it back as provided
    r = await h.post("/v1/chat/completions/render", json={**body, "max_tokens": 16})
    assert list(r.json()["sampling_params"].items())[-1] == ("max_tokens", 16)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    r = await h.post("/v1/chat/completions/render", json={"messages": MESSAGES,
                                                          "tools": [tool]})
    context = r.json()["parse_context"]
    assert context["tool_choice"] == "auto" and context["tools"][0]["function"]["name"] == "f"


async def test_render_then_generate_gives_the_chat_answer(h, grpc_client):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 12, "temperature": 0.7,
            "seed": 9}
    rendered = (await h.post("/v1/chat/completions/render", json=body)).json()
    r = await h.post("/inference/v1/generate", json=rendered)
    assert r.status_code == 200, r.text
    out = r.json()
    chat = (await h.post("/v1/chat/completions", json={**body, "return_token_ids": True})
            ).json()
    assert out["output_mode"] == "tokens"
    assert out["request_id"] == f"generate-tokens-{rendered['request_id']}"
    assert out["choices"][0]["token_ids"] == chat["choices"][0]["token_ids"]
    assert out["choices"][0]["finish_reason"] == chat["choices"][0]["finish_reason"]
    assert out["usage"]["prompt_tokens"] == chat["usage"]["prompt_tokens"]
    assert out["usage"]["completion_tokens"] == chat["usage"]["completion_tokens"]
    await assert_released(grpc_client, "fast")


async def test_render_completions_one_request_per_prompt(h):
    r = await h.post("/v1/completions/render", json={"prompt": ["one two", "three"],
                                                     "max_tokens": 3},
                     headers={"X-Request-Id": "two"})
    assert r.status_code == 200, r.text
    assert [g["request_id"] for g in r.json()] == ["cmpl-two-0", "cmpl-two-1"]
    for g, text in zip(r.json(), ("one two", "three"), strict=True):
        tokens = (await h.post("/tokenize", json={"prompt": text})).json()["tokens"]
        assert g["token_ids"] == tokens and g["sampling_params"]["max_tokens"] == 3
    resp = await h.post("/v1/responses/render", json={
        "model": MODEL, "instructions": "Be brief.", "input": "Hi", "max_output_tokens": 4,
        "request_id": "resp_r"})
    assert resp.status_code == 200, resp.text
    chat = (await h.post("/tokenize", json={"model": MODEL, "messages": MESSAGES})).json()
    assert resp.json()["token_ids"] == chat["tokens"]  # the chat request it runs as
    assert resp.json()["request_id"] == "resp_r" and resp.json()["parse_context"] is None
    assert resp.json()["sampling_params"]["max_tokens"] == 4
    gone = await h.post("/v1/responses/render", json={"input": "Hi",
                                                      "previous_response_id": "resp_x"})
    assert gone.status_code == 400 and gone.json()["error"]["param"] == "previous_response_id"
    msg = await h.post("/v1/messages/render", json={"model": MODEL, "max_tokens": 5,
                                                    "messages": [{"role": "user",
                                                                  "content": "Hi"}]})
    assert msg.status_code == 200 and msg.json()["sampling_params"]["max_tokens"] == 5


async def test_generate_streams_the_same_tokens_with_usage(h, grpc_client):
    body = {"token_ids": [5, 6, 7, 8], "sampling_params": {"max_tokens": 9, "logprobs": 2,
                                                           "ignore_eos": True}}
    whole = (await h.post("/inference/v1/generate", json=body)).json()
    events = []
    async with h.stream("POST", "/inference/v1/generate", json={
            **body, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["prompt_token_ids"] == [5, 6, 7, 8]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    streamed = [t for c in chunks for ch in c["choices"] for t in ch["token_ids"]]
    assert streamed == whole["choices"][0]["token_ids"] and len(streamed) == 9
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 9
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    logprobs = [p for c in chunks for ch in c["choices"] if ch["logprobs"]
                for p in ch["logprobs"]["content"]]
    assert logprobs == whole["choices"][0]["logprobs"]["content"]  # same values, both ways
    first = logprobs[0]
    assert first["rank"] == 1 and len(first["top_logprobs"]) == 2
    assert first["top_logprobs"][0]["token_id"] == first["token_id"]
    text = (await h.post("/inference/v1/generate", json={**body, "output_mode": "text"})
            ).json()["choices"][0]
    detok = await h.post("/detokenize", json={"tokens": text["token_ids"]})
    assert text["text"] == detok.json()["prompt"]
    await assert_released(grpc_client, "fast")


async def test_abort_requests_ends_a_generation_and_frees_it(scale_out, h, grpc_client):
    body = {"model": "llama-3.1-70b", "token_ids": [11, 12, 13], "stream": True,
            "sampling_params": {"max_tokens": 2000, "ignore_eos": True}}
    async with h.stream("POST", "/inference/v1/generate", json=body,
                        headers={"X-Request-Id": "long"}) as r:
        lines = r.aiter_lines()
        await first_data(lines)
        a = await h.post("/inference/v1/abort_requests",
                         json={"request_ids": ["generate-tokens-long"]})
        assert a.status_code == 200
        rest = [json.loads(x.removeprefix("data: ")) async for x in lines
                if x.startswith("data: {")]
    assert rest[-1]["choices"][0]["finish_reason"] == "abort"
    await assert_released(grpc_client, "slow")
    # vLLM 0.34.0 validates the body as a model: its validation handler's 400, by field
    for bad in ({}, {"request_ids": 5}, {"request_ids": [1]}):
        r = await h.post("/inference/v1/abort_requests", json=bad)
        assert r.status_code == 400 and r.json()["error"]["param"].startswith(
            "body.request_ids"), (bad, r.text)
    r = await h.post("/inference/v1/abort_requests", content=b"{")
    assert r.status_code == 400 and "JSON decode error" in r.json()["error"]["message"]
    # ... and reads the JSON whatever the Content-Type (a legacy client sends none)
    r = await h.post("/inference/v1/abort_requests", content=b'{"request_ids": "gone"}')
    assert r.status_code == 200


async def test_bad_generate_requests(h):
    cases = [
        ({"token_ids": [], "sampling_params": {}}, 400, "body.token_ids"),
        ({"token_ids": [-1], "sampling_params": {}}, 400, "body.token_ids.0"),
        ({"token_ids": [1]}, 400, "body.sampling_params"),
        ({"token_ids": [1] * 300, "sampling_params": {}}, 400, "input_tokens"),
        ({"token_ids": [1], "sampling_params": {"temperature": 9}}, 400, "temperature"),
        ({"token_ids": [1], "sampling_params": {}, "output_mode": "derender"}, 501, None),
        ({"token_ids": [1], "sampling_params": {}, "features": {}}, 400, None),
        ({"token_ids": [1], "sampling_params": {}, "model": "nope"}, 404, "model"),
    ]
    for body, status, param in cases:
        r = await h.post("/inference/v1/generate", json=body)
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]["param"] == param, (body, r.text)


async def test_without_the_flag_every_route_is_forbidden(http: httpx.AsyncClient):
    for path in (*RENDER, *DERENDER, *TOKENS):
        r = await http.post(path, json={})
        assert r.status_code == 403, path
        assert r.json()["error"] == {"message": DISABLED, "type": "PermissionDeniedError",
                                     "param": None, "code": 403}
