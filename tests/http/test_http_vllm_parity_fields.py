"""Request fields doppelchip accepted or refused unlike vLLM 0.33.0's protocol models (httpx
against the real server): `n`, `stream_interval`, `cache_salt`, `logprobs`, empty prompts, and
`response_format` merged into `structured_outputs` as vLLM merges them."""

from __future__ import annotations

import re

import httpx
import pytest
from http_helpers import TOK

ASK = [{"role": "user", "content": "x"}]
NO_CONSTRAINT = ("{'json': None, 'regex': None, 'choice': None, 'grammar': None, "
                 "'json_object': None, 'disable_any_whitespace': False, "
                 "'disable_additional_properties': False, 'whitespace_pattern': None, "
                 "'structural_tag': None")


async def refused(http: httpx.AsyncClient, path: str, body: dict) -> dict:
    r = await http.post(path, json=body)
    assert r.status_code == 400, (body, r.text)
    return r.json()["error"]


async def completion(http: httpx.AsyncClient, **fields) -> dict:
    r = await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, **fields})
    assert r.status_code == 200, (fields, r.text)
    return r.json()


async def test_n_null_is_refused_by_completions_only(http):
    err = await refused(http, "/v1/completions", {"prompt": "x", "n": None})
    assert err["type"] == "Bad Request" and err["param"] == "body.n"
    r = await http.post("/v1/chat/completions", json={"messages": ASK, "n": None,
                                                      "max_tokens": 2})
    assert r.status_code == 200 and len(r.json()["choices"]) == 1


@pytest.mark.parametrize("path,base", [("/v1/completions", {"prompt": "x"}),
                                       ("/v1/chat/completions", {"messages": ASK})])
async def test_stream_interval_and_cache_salt(http, path, base):
    err = await refused(http, path, {**base, "stream_interval": 0})
    assert err["param"] == "body.stream_interval"
    assert "Input should be greater than or equal to 1" in err["message"]
    for salt in ("", 7):
        err = await refused(http, path, {**base, "cache_salt": salt})
        assert err == {"message": "Parameter 'cache_salt' must be a non-empty string if "
                                  "provided. (parameter=cache_salt)",
                       "type": "BadRequestError", "param": "cache_salt", "code": 400}
    err = await refused(http, path, {**base, "cache_salt": "a/b"})
    assert err["message"].startswith("Parameter 'cache_salt' must be at most 128 characters")
    r = await http.post(path, json={**base, "max_tokens": 2, "stream_interval": 3,
                                    "cache_salt": "s" * 128})
    assert r.status_code == 200, r.text


async def test_logprobs_values_as_vllm_checks_them(http):
    err = await refused(http, "/v1/completions", {"prompt": "x", "logprobs": "2"})
    assert err == {"message": "`logprobs` must be an integer. (parameter=logprobs, value=2)",
                   "type": "BadRequestError", "param": "logprobs", "code": 400}
    err = await refused(http, "/v1/completions", {"prompt": "x", "logprobs": -2})
    assert err["message"] == ("`logprobs` must be a positive value or -1. "
                              "(parameter=logprobs, value=-2)")
    # -1 asks for the whole vocabulary, more than --max-logprobs (20) allows
    err = await refused(http, "/v1/completions", {"prompt": "x", "logprobs": -1})
    assert err["param"] == "logprobs"
    assert err["message"] == (f"Requested sample logprobs of {TOK.vocab_size}, which is "
                              f"greater than max allowed: 20 (parameter=logprobs, "
                              f"value={TOK.vocab_size})")
    err = await refused(http, "/v1/chat/completions", {"messages": ASK, "top_logprobs": -1})
    assert err["message"] == ("when using `top_logprobs`, `logprobs` must be set to true. "
                              "(parameter=top_logprobs)")
    err = await refused(http, "/v1/chat/completions", {"messages": ASK, "logprobs": True,
                                                       "top_logprobs": "2"})
    assert err["param"] == "top_logprobs" and err["message"].startswith(
        "`top_logprobs` must be an integer.")


async def test_empty_prompts(http):
    r = await completion(http, prompt=["", "a"])
    assert len(r["choices"]) == 2  # "" is [BOS], as vLLM tokenizes it
    for prompt in ("", None):
        err = await refused(http, "/v1/completions", {"prompt": prompt})
        assert err == {"message": "Either prompt or prompt_embeds must be provided and "
                                  "non-empty. (parameter=prompt)",
                       "type": "BadRequestError", "param": "prompt", "code": 400}
    # vLLM's renderer finds no prompt in [], its input processor an empty one in [[]]
    err = await refused(http, "/v1/completions", {"prompt": []})
    assert err == {"message": "You must pass at least one prompt (parameter=prompt)",
                   "type": "BadRequestError", "param": "prompt", "code": 400}
    for prompt in ([[]], [[1, 2], []]):
        err = await refused(http, "/v1/completions", {"prompt": prompt})
        assert err == {"message": "The decoder prompt cannot be empty",
                       "type": "BadRequestError", "param": None, "code": 400}


async def test_json_schema_without_schema_has_no_constraint(http):
    for path, base in (("/v1/completions", {"prompt": "x"}),
                       ("/v1/chat/completions", {"messages": ASK})):
        err = await refused(http, path, {**base, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x"}}})
        assert err == {"message": "You must use one kind of structured outputs constraint "
                                  f"but none are specified: {NO_CONSTRAINT}}}",
                       "type": "BadRequestError", "param": None, "code": 400}


async def test_response_format_merges_into_structured_outputs(http):
    # a json_schema without a schema sets nothing: the regex constrains the output
    r = await completion(http, max_tokens=20, structured_outputs={"regex": "[0-9]{3}"},
                         response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    assert re.fullmatch("[0-9]{3}", r["choices"][0]["text"])
    err = await refused(http, "/v1/completions", {
        "prompt": "x", "structured_outputs": {"regex": "a"},
        "response_format": {"type": "json_object"}})
    assert err["param"] is None and err["message"] == (
        "You can only use one kind of structured outputs constraint but multiple are "
        "specified: {'json': None, 'regex': 'a', 'choice': None, 'grammar': None, "
        "'json_object': True, 'disable_any_whitespace': False, "
        "'disable_additional_properties': False, 'whitespace_pattern': None, "
        "'structural_tag': None}")
    err = await refused(http, "/v1/completions", {"prompt": "x", "structured_outputs": {}})
    assert err["message"] == ("You must use one kind of structured outputs constraint but none "
                              f"are specified: {NO_CONSTRAINT}, '_backend': None, "
                              "'_backend_was_auto': False}")


async def test_detokenize_refuses_negative_ids_as_pydantic_does(http):
    err = await refused(http, "/detokenize", {"tokens": [-1]})
    assert err["type"] == "Bad Request" and err["param"] == "body.tokens.0"
