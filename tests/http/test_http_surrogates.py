"""A lone surrogate anywhere in a JSON body (JSON lets one through: an escaped `\\ud800`, or
the three bytes of one, which Python's decoder accepts) is a 400 naming it on every route —
not a tokenizer's, grammar compiler's or encoder's crash as a 500 or a dropped connection —
and leaves nothing behind; a surrogate pair (an escaped emoji) is text and is served."""

from __future__ import annotations

import json

import pytest
from fleets import assert_released

MODEL = "llama-3.1-8b"
HI = [{"role": "user", "content": "hi"}]
BODIES = {  # each with the one string `s` placed where it reaches something that encodes it
    "prompt": ("/v1/completions", lambda s: {"prompt": s, "max_tokens": 2}),
    "chat": ("/v1/chat/completions",
             lambda s: {"max_tokens": 2, "messages": [{"role": "user", "content": s}]}),
    "stop": ("/v1/completions", lambda s: {"prompt": "hi", "max_tokens": 2, "stop": [s]}),
    "schema key": ("/v1/chat/completions", lambda s: {"max_tokens": 2, "messages": HI,
                   "response_format": {"type": "json_schema", "json_schema": {
                       "name": "x", "schema": {"type": "object", "properties": {
                           s: {"type": "string"}}}}}}),
    "choice": ("/v1/completions", lambda s: {"prompt": "hi", "max_tokens": 2,
                                             "structured_outputs": {"choice": [s, "b"]}}),
    "tool name": ("/v1/chat/completions", lambda s: {
        "max_tokens": 2, "messages": HI, "tool_choice": "required", "tools": [{
            "type": "function", "function": {"name": s, "parameters": {"type": "object"}}}]}),
    "model": ("/v1/completions", lambda s: {"model": s, "prompt": "hi", "max_tokens": 2}),
    "request id": ("/v1/completions", lambda s: {"request_id": s, "prompt": "hi",
                                                 "max_tokens": 2}),
    "system": ("/v1/messages", lambda s: {"max_tokens": 2, "system": s, "messages": HI}),
    "count": ("/v1/messages/count_tokens",
              lambda s: {"messages": [{"role": "user", "content": s}]}),
    "responses": ("/v1/responses", lambda s: {"input": s, "max_output_tokens": 2}),
    "invocations": ("/invocations", lambda s: {"prompt": s, "max_tokens": 2}),
    "tokenize": ("/tokenize", lambda s: {"prompt": s}),
}


@pytest.mark.parametrize("where", BODIES)
async def test_a_lone_surrogate_is_a_400_naming_it(http, client, where):
    path, body = BODIES[where]
    escaped = json.dumps({"model": MODEL, **body("caf\u00e9 \ud800")}).encode()
    raw = escaped.replace(b"\\ud800", b"\xed\xa0\x80")  # the surrogate's own (CESU-8) bytes
    assert b"\\ud800" in escaped and b"\xed\xa0\x80" in raw
    for sent in (escaped, raw):
        r = await http.post(path, content=sent, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        assert "a lone surrogate (U+D800), which is not Unicode text" in r.text
    await assert_released(client, "fast")


async def test_a_surrogate_pair_is_text(http):
    body = json.dumps({"model": MODEL, "prompt": "smile \U0001F600", "max_tokens": 2})
    assert "\\ud83d\\ude00" in body  # (json.dumps escapes it as a pair)
    r = await http.post("/v1/completions", content=body.encode(),
                        headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
