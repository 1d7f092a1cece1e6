"""Where doppelchip's HTTP front end followed vLLM 0.33.0 less than exactly (httpx against the
real server): the JSON media-type check of vLLM's POST routes (`validate_json_request`), the
shape of its RequestValidationError answer (every error listed, `param` the error's
location), special tokens in /tokenize, /detokenize and echo, and the FastAPI docs routes."""

from __future__ import annotations

import json

import httpx
import pytest
from http_helpers import TOK

ERROR_KEYS = {"message", "type", "param", "code"}
MEDIA = "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
# vLLM's POST routes that take a JSON body (each has `Depends(validate_json_request)`), and a
# body each would accept
JSON_ROUTES = {
    "/v1/completions": {"prompt": "x", "max_tokens": 1},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
    "/tokenize": {"prompt": "x"},
    "/detokenize": {"tokens": [14891]},
    "/v1/load_lora_adapter": {"lora_name": "a", "lora_path": "/nowhere"},
    "/v1/unload_lora_adapter": {"lora_name": "a"},
}


def error_of(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == ERROR_KEYS and err["code"] == status
    return err


@pytest.mark.parametrize("path", sorted(JSON_ROUTES))
async def test_json_routes_refuse_other_media_types(http, path):
    body = json.dumps(JSON_ROUTES[path]).encode()
    for headers in ({"Content-Type": "text/plain"},
                    {"Content-Type": "application/x-www-form-urlencoded"},
                    {"Content-Type": "application/vnd.api+json"},
                    {}):  # no Content-Type at all
        err = error_of(await http.post(path, content=body, headers=headers))
        assert err == {"message": MEDIA, "type": "Bad Request", "param": None, "code": 400}, \
            headers
    for ctype in ("application/json; charset=utf-8", "Application/JSON"):  # the media type
        r = await http.post(path, content=body, headers={"Content-Type": ctype})
        assert r.json().get("error", {}).get("message") != MEDIA, ctype


async def test_bad_json_names_its_position(http):
    raw = '{"prompt": x}'
    with pytest.raises(json.JSONDecodeError) as decode:
        json.loads(raw)
    pos = decode.value.pos
    err = error_of(await http.post("/v1/completions", content=raw.encode(),
                                   headers={"Content-Type": "application/json"}))
    assert err["type"] == "Bad Request" and err["param"] == f"body.{pos}"
    assert err["message"] == (
        f"1 validation error:\n  {{'type': 'json_invalid', 'loc': 'body.{pos}', 'msg': 'JSON "
        "decode error', 'input': '<dict of 0 items>', 'ctx': {'error': 'Expecting value'}}")
    for raw_body in (b"\xff\xfe{", b"[" * 100_000):  # not text; nested past json.loads
        err = error_of(await http.post("/v1/completions", content=raw_body,
                                       headers={"Content-Type": "application/json"}))
        assert err == {"message": "There was an error parsing the body", "type": "Bad Request",
                       "param": None, "code": 400}
    empty = error_of(await http.post("/v1/completions", content=b"",
                                     headers={"Content-Type": "application/json"}))
    assert empty["param"] == "body"
    assert empty["message"] == ("1 validation error:\n  {'type': 'missing', 'loc': 'body', "
                                "'msg': 'Field required', 'input': 'None'}")


async def test_validation_message_lists_every_error(http):
    err = error_of(await http.post("/v1/completions", json={
        "prompt": "x", "stream": "maybe", "stream_options": 5}))
    assert err["type"] == "Bad Request" and err["param"] == "body.stream"
    head, first, second = err["message"].split("\n")
    assert head == "2 validation errors:"
    assert first == ("  {'type': 'bool_parsing', 'loc': 'body.stream', 'msg': 'Input should be "
                     "a valid boolean, unable to interpret input', 'input': 'maybe'}")
    assert second.startswith("  {'type': 'model_type', 'loc': 'body.stream_options', ")


async def test_tool_choice_is_checked_before_the_fields(http):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    ask = [{"role": "user", "content": "x"}]
    err = error_of(await http.post("/v1/chat/completions", json={
        "messages": ask, "tools": tools, "tool_choice": "bogus"}))
    assert err["type"] == "BadRequestError" and err["param"] == "tool_choice"
    assert err["message"] == ('Invalid value for `tool_choice`: bogus! Only named tools, "none", '
                              '"auto" or "required" are supported. (parameter=tool_choice)')
    err = error_of(await http.post("/v1/chat/completions", json={
        "messages": ask, "tool_choice": "bogus"}))
    assert err["message"] == ("When using `tool_choice`, `tools` must be set. "
                              "(parameter=tool_choice)")
    err = error_of(await http.post("/v1/chat/completions", json={
        "messages": ask, "tools": tools, "tool_choice": {"type": "function"}}))
    assert err["param"] == "tool_choice.function"
    assert err["message"].startswith("Invalid value for `function`: `None` in `tool_choice`! ")


async def test_special_tokens_kept_as_vllm_decodes_them(http):
    ids = [TOK.bos_token_id, *TOK.encode("Hello world")]
    back = (await http.post("/detokenize", json={"tokens": ids})).json()
    assert back == {"prompt": "<|begin_of_text|>Hello world"}
    strs = (await http.post("/tokenize", json={"prompt": "Hello world",
                                               "return_token_strs": True})).json()
    assert strs["tokens"] == ids
    assert strs["token_strs"] == ["<|begin_of_text|>", "Hello", "\u0120world"]
    plain = (await http.post("/tokenize", json={"prompt": "Hello world"})).json()
    assert "token_strs" in plain and plain["token_strs"] is None


async def test_echo_of_token_ids_keeps_bos_and_of_text_is_the_text(http):
    ids = [TOK.bos_token_id, *TOK.encode("Hello world")]
    r = (await http.post("/v1/completions", json={"prompt": ids, "echo": True,
                                                  "max_tokens": 2})).json()
    assert r["choices"][0]["text"].startswith("<|begin_of_text|>Hello world")
    r = (await http.post("/v1/completions", json={"prompt": "Hello world", "echo": True,
                                                  "max_tokens": 2})).json()
    assert r["choices"][0]["text"].startswith("Hello world")


async def test_fastapi_docs_are_served(http):
    r = await http.get("/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    spec = r.json()
    assert spec["info"] == {"title": "FastAPI", "version": "0.1.0"}  # vLLM's FastAPI()
    assert {"/v1/completions", "/v1/chat/completions", "/tokenize"} <= set(spec["paths"])
    for path in ("/docs", "/redoc"):
        page = await http.get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "/openapi.json" in page.text
