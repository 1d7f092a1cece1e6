"""Prompt length, `truncate_prompt_tokens` and `max_tokens` over HTTP, as vLLM 0.33.0 decides
them (server/http/lengths.py): an over-long budget is clamped to the context's end, not
refused; what cannot fit at all is a 400 with vLLM's message and `param`."""

from __future__ import annotations

import pytest
from fleets import assert_released
from http_helpers import TOK, stream_events

from server.http.errors import HttpError
from server.http.lengths import check_requested, fit_prompt, output_budget

MODEL, CTX = "llama-3.1-8b", 256  # the test fleet's "fast" deployment and its context


def error(fn, *args, **kw) -> HttpError:
    with pytest.raises(HttpError) as e:
        fn(*args, **kw)
    assert e.value.status == 400
    return e.value


def test_budgets_above_the_context_are_refused_naming_the_field():
    e = error(check_requested, 5000, "max_completion_tokens", None, 4096)
    assert e.param == "max_completion_tokens"
    assert e.message.startswith("max_completion_tokens=5000 cannot be greater than "
                                "max_model_len=4096")
    e = error(check_requested, None, "max_tokens", 4097, 4096)
    assert e.param == "truncate_prompt_tokens"
    check_requested(4096, "max_tokens", 4096, 4096)  # equal is allowed


def test_truncation_keeps_the_last_tokens_and_a_text_prompts_bos():
    ids = list(range(100, 110))
    assert fit_prompt(ids, 4096, truncate=3) == [107, 108, 109]
    assert fit_prompt(ids, 4096, truncate=3, keeps_bos=True) == [100, 108, 109]
    assert fit_prompt(ids, 4096, truncate=3, side="right", keeps_bos=True) == [100, 101, 102]
    assert fit_prompt(ids, 4096, truncate=3, side="left", keeps_bos=True) == [107, 108, 109]
    assert fit_prompt(ids, 5, truncate=-1) == [106, 107, 108, 109]  # max_model_len - 1
    assert fit_prompt(ids, 4096, truncate=50) == ids


def test_a_prompt_longer_than_the_context_is_vllms_400():
    e = error(fit_prompt, list(range(10)), 8)
    assert e.param == "input_tokens"
    assert e.message.startswith("This model's maximum context length is 8 tokens. However, "
                                "your prompt contains 10 input tokens")
    assert "at least 9 input tokens" in error(fit_prompt, list(range(10)), 8,
                                              from_text=True).message
    assert fit_prompt(list(range(8)), 8) == list(range(8))


def test_the_budget_is_clamped_to_the_context():
    assert output_budget(4096, 3, 4096) == 4093
    assert output_budget(None, 3, 4096) == 4093
    assert output_budget(16, 3, 4096) == 16
    assert "at least 1, got 0" in error(output_budget, 16, 4096, 4096).message


async def test_max_tokens_past_the_context_generates_to_its_end(http, client):
    prompt = "Hi " * 30
    n = len(TOK.encode(prompt)) + 1  # BOS
    body = {"model": MODEL, "prompt": prompt, "max_tokens": CTX - n + 5, "ignore_eos": True}
    r = await http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["usage"]["prompt_tokens"] == n
    assert out["usage"]["completion_tokens"] == CTX - n
    assert out["choices"][0]["finish_reason"] == "length"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
            "max_completion_tokens": CTX, "ignore_eos": True}
    r = await http.post("/v1/chat/completions", json=chat)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == CTX
    await assert_released(client, "fast")


async def test_lengths_that_cannot_fit_are_vllms_errors(http):
    r = await http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi",
                                                 "max_tokens": CTX + 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = await http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "word " * 500}]})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "input_tokens"
    assert err["message"].startswith(f"This model's maximum context length is {CTX} tokens. "
                                     f"However, your prompt contains at least {CTX + 1} input "
                                     "tokens")
    r = await http.post("/v1/completions", json={"model": MODEL,
                                                 "prompt": list(range(300, 300 + CTX))})
    assert r.status_code == 400 and "max_tokens must be at least 1, got 0" in r.text


async def test_truncate_prompt_tokens_cuts_the_prompt_from_the_left(http):
    long = "word " * 600
    r = await http.post("/v1/completions", json={
        "model": MODEL, "prompt": long, "max_tokens": 4, "truncate_prompt_tokens": 100})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 100
    r = await http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": long}], "max_tokens": 4,
        "truncate_prompt_tokens": -1})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == CTX - 1
    ids = list(range(300, 400))
    r = await http.post("/v1/completions", json={
        "model": MODEL, "prompt": ids, "max_tokens": 1, "truncate_prompt_tokens": 10,
        "echo": True})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"].startswith(TOK.decode(ids[-10:]))
    assert r.json()["usage"]["prompt_tokens"] == 10


@pytest.mark.parametrize("stream", [False, True])
async def test_echo_with_max_tokens_0_answers_the_prompt_alone(http, stream):
    body = {"model": MODEL, "prompt": "Hello there", "max_tokens": 0, "echo": True,
            "stream": stream}
    if not stream:
        r = await http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == "Hello there"
        assert r.json()["usage"]["completion_tokens"] == 1  # generated, not shown (as vLLM)
        return

    r, events = await stream_events(http, "/v1/completions", body)
    assert r.status_code == 200
    text = "".join(e["choices"][0]["text"] for e in events if isinstance(e, dict))
    assert text == "Hello there" and events[-1] == "[DONE]"
    r = await http.post("/v1/completions", json={**body, "echo": False, "stream": False})
    assert r.status_code == 400  # without echo, max_tokens 0 is still refused


async def test_a_null_max_tokens_in_completions_is_16_as_vllm(http):
    """vLLM's `normalize_null_max_tokens`: completions' `max_tokens: null` is the default 16
    (not the rest of the context)."""
    r = await http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi",
                                                 "max_tokens": None, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 16
