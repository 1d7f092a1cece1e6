"""`curl`-level checks of every route and error shape (httpx against the real server)."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest
from fleets import assert_released
from http_helpers import TOK, stream_events
from server_proc import metric

from server.http.state import VLLM_VERSION

ERROR_KEYS = {"message", "type", "param", "code"}


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == ERROR_KEYS and err["code"] == status
    return err


async def test_health_ping_version_models(http):
    r = await http.get("/health")
    assert r.status_code == 200 and r.content == b""
    assert (await http.get("/ping")).status_code == 200
    assert (await http.post("/ping")).status_code == 200
    assert (await http.get("/version")).json()["version"] == VLLM_VERSION
    models = (await http.get("/v1/models")).json()
    assert models["object"] == "list"
    ids = {m["id"]: m for m in models["data"]}
    assert set(ids) == {"llama-3.1-8b", "llama-3.1-70b"}  # one per model of the test fleet
    assert ids["llama-3.1-8b"]["object"] == "model" and ids["llama-3.1-8b"]["max_model_len"] == 256


async def test_tokenize_detokenize_roundtrip(http):
    r = (await http.post("/tokenize", json={"prompt": "Hello world",
                                            "return_token_strs": True})).json()
    assert r["tokens"] == [TOK.bos_token_id, *TOK.encode("Hello world")]
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 256
    # vLLM's convert_ids_to_tokens: vocabulary strings, BOS by name, "Ġ" for a space
    assert r["token_strs"] == ["<|begin_of_text|>", "Hello", "\u0120world"]
    plain = (await http.post("/tokenize", json={"prompt": "Hello world",
                                                "add_special_tokens": False})).json()
    assert plain["tokens"] == TOK.encode("Hello world")
    chat = (await http.post("/tokenize", json={"messages": [{"role": "user",
                                                             "content": "hi"}]})).json()
    assert chat["tokens"] == TOK.encode_chat([{"role": "user", "content": "hi"}])
    # the chat form: no BOS on top of the template's unless asked; continue_final_message
    bos = (await http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}],
                                              "add_special_tokens": True})).json()
    assert bos["tokens"] == [TOK.bos_token_id, *chat["tokens"]]
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]
    cont = (await http.post("/tokenize", json={"messages": msgs, "add_generation_prompt": False,
                                               "continue_final_message": True})).json()
    assert cont["tokens"] == TOK.encode(
        TOK.apply_chat_template(msgs, False).removesuffix(TOK.eos_token))
    back = (await http.post("/detokenize", json={"tokens": plain["tokens"]})).json()
    assert back == {"prompt": "Hello world"}
    err = error_of(await http.post("/detokenize", json={"tokens": [10**9]}), 400)
    assert err["param"] == "tokens"


async def test_metrics_get_and_head(http, server):
    await http.post("/v1/completions", json={"prompt": "count me", "max_tokens": 2})
    r = await http.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "version=0.0.4" in r.headers["content-type"]
    text = r.text
    assert "vllm:prompt_tokens_total{" in text  # ':' names kept, even if asked for OpenMetrics
    assert metric(text, "http_requests_total", handler="/v1/completions", method="POST",
                  status="2xx") >= 1
    assert 'handler="/metrics"' not in text and 'handler="/health"' not in text
    head = await http.head("/metrics")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == r.headers["content-type"]


async def test_x_request_id_echoed_and_used(http):
    r = await http.post("/v1/completions", json={"prompt": "id", "max_tokens": 2},
                        headers={"X-Request-Id": "my-id-1"})
    assert r.headers["x-request-id"] == "my-id-1" and r.json()["id"] == "cmpl-my-id-1"
    r = await http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
        headers={"X-Request-Id": "my-id-2"})
    assert r.headers["x-request-id"] == "my-id-2" and r.json()["id"] == "chatcmpl-my-id-2"
    r, events = await stream_events(http, "/v1/completions", {
        "prompt": "id", "max_tokens": 2, "stream": True}, {"X-Request-Id": "my-id-3"})
    assert r.headers["x-request-id"] == "my-id-3"
    assert {e["id"] for e in events[:-1]} == {"cmpl-my-id-3"} and events[-1] == "[DONE]"
    r = await http.post("/v1/completions", json={"prompt": "id", "max_tokens": 0},
                        headers={"X-Request-Id": "my-id-4"})
    assert r.status_code == 400 and r.headers["x-request-id"] == "my-id-4"
    generated = await http.post("/v1/completions", json={"prompt": "id", "max_tokens": 2})
    assert generated.json()["id"] == "cmpl-" + generated.headers["x-request-id"]


async def test_error_shapes(http):
    err = error_of(await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 0}),
                   400)
    assert err["type"] == "BadRequestError" and err["param"] == "max_tokens"
    assert err["message"] == "max_tokens must be at least 1, got 0. (parameter=max_tokens, " \
        "value=0)"  # vLLM's VLLMValidationError, as its handler answers it
    err = error_of(await http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}), 400)
    assert err["param"] == "max_tokens"  # vLLM's SamplingParams field
    err = error_of(await http.post("/v1/completions", json={"prompt": "x", "model": "gpt-9"}),
                   404)
    assert err["type"] == "NotFoundError" and err["param"] == "model"
    assert "gpt-9" in err["message"] and "llama-3.1-8b" in err["message"]
    err = error_of(await http.post("/v1/completions", json={"prompt": "x",
                                                            "max_tokens": "many"}), 400)
    assert err["type"] == "Bad Request" and err["param"] == "body.max_tokens"
    err = error_of(await http.post("/v1/chat/completions", json={"model": "llama-3.1-8b"}),
                   400)
    assert err["param"] == "body.messages"
    error_of(await http.post("/v1/completions", content=b"{not json"), 400)
    for body, param in (({"temperature": 5}, "temperature"), ({"top_p": 0}, "top_p"),
                        ({"n": 0}, None), ({"min_tokens": 9, "max_tokens": 2}, None),
                        ({"logprobs": 99}, "logprobs"),
                        ({"stream_options": {"include_usage": True}}, "stream_options")):
        err = error_of(await http.post("/v1/completions", json={"prompt": "x", **body}), 400)
        assert err["param"] == param, body
    err = error_of(await http.post("/v1/completions", json={"prompt": "x " * 300}), 400)
    assert "context" in err["message"]  # longer than the deployment's 256 tokens
    error_of(await http.get("/no/such/route"), 404)


async def test_overload_is_429_and_frees_everything(server, client):
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as h:
        def req(i: int) -> httpx.Request:
            return h.build_request("POST", "/v1/completions", json={
                "model": "llama-3.1-70b", "prompt": f"busy {i}", "max_tokens": 2000,
                "ignore_eos": True, "stream": True})

        first = await h.send(req(0), stream=True)
        lines = first.aiter_lines()
        while not (await anext(lines)).startswith("data: "):  # its first token: it runs
            pass
        responses = [first]
        for i in range(1, 5):  # one at a time: 2 wait (max_waiting 2), then refusals
            responses.append(await h.send(req(i), stream=True))
        statuses = [r.status_code for r in responses]
        assert statuses[:3] == [200, 200, 200] and statuses[3:] == [429, 429]
        err = (await responses[3].aread()).decode()
        assert '"code":429' in err and "waiting queue is full" in err
        for r in responses:
            await r.aclose()
    await assert_released(client, "slow")


async def test_logprobs_emulated_and_deterministic(http):
    body = {"prompt": "log me", "max_tokens": 6, "logprobs": 3, "seed": 11,
            "ignore_eos": True}
    a = (await http.post("/v1/completions", json=body)).json()["choices"][0]
    b = (await http.post("/v1/completions", json=body)).json()["choices"][0]
    lp = a["logprobs"]
    assert lp == b["logprobs"] and len(lp["tokens"]) == 6
    assert "".join(lp["tokens"]) == a["text"]
    assert lp["text_offset"][0] == 0 and lp["text_offset"][1] == len(lp["tokens"][0])
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"],
                                 strict=True):
        assert math.log(0.5) < value <= 0 and top[token] == value and len(top) == 3
        assert sum(math.exp(v) for v in top.values()) < 1
        assert max(top.values()) == value
    _, events = await stream_events(http, "/v1/completions", {**body, "stream": True})
    streamed = [t for e in events[:-1] for t in e["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed == lp["token_logprobs"]
    chat = (await http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "logprobs": True,
        "top_logprobs": 2, "ignore_eos": True})).json()["choices"][0]
    content = chat["logprobs"]["content"]
    assert len(content) == 4 and all(len(c["top_logprobs"]) == 2 for c in content)
    assert "".join(c["token"] for c in content) == chat["message"]["content"]
    assert all(c["top_logprobs"][0]["logprob"] == c["logprob"] for c in content)


async def test_completion_prompt_forms(http):
    ids = TOK.encode("token prompt")
    r = (await http.post("/v1/completions", json={"prompt": ids, "max_tokens": 3})).json()
    assert r["usage"]["prompt_tokens"] == len(ids)
    r = (await http.post("/v1/completions", json={"prompt": ["one", "two"], "n": 2,
                                                  "max_tokens": 3, "ignore_eos": True})).json()
    assert sorted(c["index"] for c in r["choices"]) == [0, 1, 2, 3]
    assert r["usage"]["completion_tokens"] == 12
    r = (await http.post("/v1/completions", json={"prompt": "echo this", "max_tokens": 3,
                                                  "echo": True})).json()
    assert r["choices"][0]["text"].startswith("echo this")


async def test_concurrent_streams(http, client):
    async def one(i: int) -> int:
        _, events = await stream_events(http, "/v1/completions", {
            "prompt": f"parallel {i}", "max_tokens": 20, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}})
        return events[-2]["usage"]["completion_tokens"]

    assert await asyncio.gather(*(one(i) for i in range(16))) == [20] * 16
    await assert_released(client, "fast")


async def test_http_series_are_vllms(http):
    """Names, types, labels, help and buckets of the HTTP families as vLLM 0.33.0 exports
    them (`tests/observability/vllm_reference.json` `http_series`)."""
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    ref = json.loads((Path(__file__).resolve().parents[1]
                      / "observability/vllm_reference.json").read_text())["http_series"]
    await http.post("/v1/completions", json={"prompt": "spec", "max_tokens": 2})
    await http.get("/health")
    families = {f.name: f for f in text_string_to_metric_families(
        (await http.get("/metrics")).text)}
    for name, spec in ref["series"].items():
        base = name.removesuffix("_total") if spec["type"] == "counter" else name
        fam = families[base]
        assert fam.type == spec["type"], name
        assert fam.documentation.strip() == spec["help"].strip(), name  # the parser strips
        labels = {k for s in fam.samples for k in s.labels if k not in ("le", "quantile")}
        assert labels == set(spec["labels"]), name
        if "buckets" in spec:
            les = sorted({float(s.labels["le"]) for s in fam.samples if "le" in s.labels})
            assert les == [*map(float, spec["buckets"]), math.inf], name
    handlers = {s.labels.get("handler") for s in families["http_requests"].samples}
    assert not handlers & set(ref["excluded_handlers"])


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
async def test_continuous_usage_stats_on_every_chunk(http, route):
    """vLLM's `stream_options.continuous_usage_stats`: every chunk carries the usage so far
    (the prompt's tokens, the choice's completion tokens up to it), growing to the total."""
    body = {"max_tokens": 6, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            **({"prompt": "count with me"} if route == "/v1/completions" else
               {"messages": [{"role": "user", "content": "count with me"}]})}
    _, events = await stream_events(http, route, body)
    chunks = [e for e in events if isinstance(e, dict) and e.get("choices")]
    used = [e["usage"]["completion_tokens"] for e in chunks]
    assert used == sorted(used) and used[-1] == 6  # (a slow reader may get them in one)
    if route == "/v1/chat/completions":
        assert used[0] == 0  # the role chunk, as vLLM's
    assert all(e["usage"]["total_tokens"] == e["usage"]["prompt_tokens"] + n
               for e, n in zip(chunks, used, strict=True))
    assert len({e["usage"]["prompt_tokens"] for e in chunks}) == 1


async def test_tokenize_without_prompt_or_messages_is_vllms_union_error(http):
    """vLLM validates /tokenize's body as the union of its two forms: neither is one error for
    each (FastAPI's RequestValidationError, answered by vLLM's handler)."""
    err = error_of(await http.post("/tokenize", json={}), 400)
    assert err["message"] == (
        "2 validation errors:\n"
        "  {'type': 'missing', 'loc': 'body.TokenizeCompletionRequest.prompt', "
        "'msg': 'Field required', 'input': '<dict of 0 items>'}\n"
        "  {'type': 'missing', 'loc': 'body.TokenizeChatRequest.messages', "
        "'msg': 'Field required', 'input': '<dict of 0 items>'}")
    assert err["param"] == "body.TokenizeCompletionRequest.prompt"


async def test_tokenizer_info_needs_its_flag(http):
    """vLLM mounts /tokenizer_info only with --enable-tokenizer-info-endpoint
    (test_http_tokenizer_info.py turns it on)."""
    assert (await http.get("/tokenizer_info")).status_code == 404
