"""Response shapes field for field as vLLM 0.33.0 writes them: non-streamed answers are its
pydantic models' `model_dump()` (every field, None included; a message's `tool_calls` only
when made), stream chunks carry the fields its serving code sets; `return_token_ids`, chat
`echo`, `continuous_usage_stats` only with `include_usage`, `/v1/models`' permission."""

from __future__ import annotations

import pytest
from http_helpers import TOK, stream_events

# vLLM 0.33.0's field order: completion/protocol.py, chat_completion/protocol.py,
# serve/engine/protocol.py (UsageInfo, PromptTokenUsageInfo, ModelPermission)
COMPLETION = ["id", "object", "created", "model", "choices", "service_tier",
              "system_fingerprint", "usage", "kv_transfer_params", "ec_transfer_params",
              "metrics"]
COMPLETION_CHOICE = ["index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids",
                     "prompt_logprobs", "prompt_token_ids", "routed_experts", "weight_versions"]
CHAT = ["id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
        "usage", "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params",
        "ec_transfer_params", "metrics"]
CHAT_CHOICE = ["index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids",
               "routed_experts", "weight_versions"]
MESSAGE = ["role", "content", "refusal", "audio", "function_call", "reasoning"]  # (0.34.0)
USAGE = ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
         "completion_tokens_details"]
PERMISSION = ["id", "object", "created", "allow_create_engine", "allow_sampling",
              "allow_logprobs", "allow_search_indices", "allow_view", "allow_fine_tuning",
              "organization", "group", "is_blocking"]
CHAT_BODY = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
             "ignore_eos": True}


async def test_completion_is_vllms_model_dump(http):
    r = (await http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3,
                                                  "ignore_eos": True})).json()
    assert list(r) == COMPLETION
    assert list(r["choices"][0]) == COMPLETION_CHOICE
    assert list(r["usage"]) == USAGE
    assert list(r["usage"]["prompt_tokens_details"]) == ["cached_tokens",
                                                         "created_cache_tokens",
                                                         "multimodal_tokens"]
    assert r["choices"][0]["token_ids"] is None and r["choices"][0]["prompt_token_ids"] is None


async def test_chat_is_vllms_model_dump_without_empty_tool_calls(http):
    r = (await http.post("/v1/chat/completions", json=CHAT_BODY)).json()
    assert list(r) == CHAT
    choice = r["choices"][0]
    assert list(choice) == CHAT_CHOICE
    assert list(choice["message"]) == MESSAGE  # no "tool_calls": [] (ChatMessage._serialize)
    assert list(r["usage"]) == USAGE


async def test_chat_tool_calls_are_kept_when_made(http):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    r = (await http.post("/v1/chat/completions", json={
        **CHAT_BODY, "max_tokens": 64, "ignore_eos": False, "tools": [tool],
        "tool_choice": "required"})).json()
    message = r["choices"][0]["message"]
    assert message["tool_calls"] and message["tool_calls"][0]["function"]["name"] == "get_weather"


async def test_return_token_ids(http):
    r = (await http.post("/v1/completions", json={"prompt": "Hello world", "max_tokens": 4,
                                                  "ignore_eos": True,
                                                  "return_token_ids": True})).json()
    choice = r["choices"][0]
    assert choice["prompt_token_ids"] == [TOK.bos_token_id, *TOK.encode("Hello world")]
    assert len(choice["token_ids"]) == 4 and TOK.decode(choice["token_ids"]) == choice["text"]
    chat = (await http.post("/v1/chat/completions",
                            json={**CHAT_BODY, "return_token_ids": True})).json()
    assert chat["prompt_token_ids"] == TOK.encode_chat(CHAT_BODY["messages"])
    assert len(chat["choices"][0]["token_ids"]) == 3
    assert chat["usage"]["prompt_tokens"] == len(chat["prompt_token_ids"])


async def test_streamed_token_ids_add_up_and_the_prompt_comes_once(http):
    body = {"prompt": "Hello world", "max_tokens": 5, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    _, events = await stream_events(http, "/v1/completions", body)
    choices = [e["choices"][0] for e in events if isinstance(e, dict) and e.get("choices")]
    assert sum(len(c["token_ids"]) for c in choices) == 5
    prompts = [c["prompt_token_ids"] for c in choices if c["prompt_token_ids"] is not None]
    assert prompts == [[TOK.bos_token_id, *TOK.encode("Hello world")]]
    _, events = await stream_events(http, "/v1/chat/completions",
                                    {**CHAT_BODY, "stream": True, "return_token_ids": True})
    chunks = [e for e in events if isinstance(e, dict) and e.get("choices")]
    assert chunks[0]["prompt_token_ids"] == TOK.encode_chat(CHAT_BODY["messages"])
    assert sum(len(e["choices"][0].get("token_ids") or ()) for e in chunks[1:]) == 3


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_echo_prepends_the_last_message_of_the_answers_role(http, stream):
    body = {"messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Sure thing"}],
            "max_tokens": 2, "ignore_eos": True, "continue_final_message": True,
            "add_generation_prompt": False, "echo": True, "stream": stream}
    plain = {**body, "echo": False, "seed": 7}
    if stream:
        _, events = await stream_events(http, "/v1/chat/completions", {**body, "seed": 7})
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                       if isinstance(e, dict) and e.get("choices"))
        _, events = await stream_events(http, "/v1/chat/completions", plain)
        generated = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                            if isinstance(e, dict) and e.get("choices"))
    else:
        text = (await http.post("/v1/chat/completions", json={**body, "seed": 7})
                ).json()["choices"][0]["message"]["content"]
        generated = (await http.post("/v1/chat/completions", json=plain)
                     ).json()["choices"][0]["message"]["content"]
    assert text == "Sure thing" + generated and generated
    # a user's last message is not the answer's role: nothing is echoed
    user_last = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                 "ignore_eos": True, "echo": True, "seed": 7}
    echoed = (await http.post("/v1/chat/completions", json=user_last)).json()
    assert not echoed["choices"][0]["message"]["content"].startswith("Hi")


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
async def test_continuous_usage_needs_include_usage(http, route):
    """vLLM's `should_include_usage`: continuous_usage_stats alone adds no usage anywhere."""
    body = {"max_tokens": 3, "ignore_eos": True, "stream": True,
            "stream_options": {"continuous_usage_stats": True},
            **({"prompt": "count"} if route == "/v1/completions" else
               {"messages": [{"role": "user", "content": "count"}]})}
    _, events = await stream_events(http, route, body)
    chunks = [e for e in events if isinstance(e, dict)]
    assert chunks and not any("usage" in e for e in chunks)


async def test_model_cards_carry_vllms_default_permission(http):
    cards = (await http.get("/v1/models")).json()["data"]
    for card in cards:
        (perm,) = card["permission"]
        assert list(perm) == PERMISSION and perm["id"].startswith("modelperm-")
        assert perm["allow_sampling"] and perm["organization"] == "*"
    again = (await http.get("/v1/models")).json()["data"]
    assert again[0]["permission"][0]["id"] != cards[0]["permission"][0]["id"]  # made when asked


@pytest.mark.parametrize("bad", [TOK.vocab_size, 10**9])  # (negative ids: the schema's 400)
async def test_a_token_id_out_of_the_vocabulary_is_vllms_400(http, bad):
    r = await http.post("/v1/completions", json={"prompt": [5, bad, 7], "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == f"Token id {bad} is out of vocabulary"


async def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_asks(http):
    """lm-eval's log-likelihood request: echo, max_tokens 0, logprobs — one logprob per prompt
    token (the first None), and the same values in `prompt_logprobs`, keyed by token id."""
    ids = [TOK.bos_token_id, *TOK.encode("Hello world")]
    r = (await http.post("/v1/completions", json={"prompt": "Hello world", "max_tokens": 0,
                                                  "logprobs": 1, "echo": True})).json()
    choice = r["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == "Hello world"
    assert lp["tokens"] == [TOK.decode_with_special([ids[0]]),
                            *(TOK.decode([t]) for t in ids[1:])]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(v <= 0 for v in lp["token_logprobs"][1:])
    ends = [o + len(t) for o, t in zip(lp["text_offset"], lp["tokens"], strict=True)]
    assert lp["text_offset"] == [0, *ends[:-1]]
    plp = choice["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    for entry, token, value in zip(plp[1:], ids[1:], lp["token_logprobs"][1:], strict=True):
        assert entry[str(token)] == {"logprob": value, "rank": 1,
                                     "decoded_token": TOK.decode([token])}


async def test_echoed_logprobs_stream_as_they_answer(http):
    body = {"prompt": "Hello world", "max_tokens": 3, "logprobs": 2, "echo": True,
            "ignore_eos": True}
    whole = (await http.post("/v1/completions", json=body)).json()["choices"][0]["logprobs"]
    _, events = await stream_events(http, "/v1/completions", {**body, "stream": True})
    parts = [e["choices"][0]["logprobs"] for e in events if isinstance(e, dict)
             and e.get("choices")]
    joined = {k: [x for p in parts for x in p[k]] for k in whole}
    assert joined == whole
    assert len(whole["tokens"]) == 3 + 3  # BOS, "Hello", " world", then the 3 generated


async def test_prompt_logprobs_over_the_max_is_vllms_400(http):
    r = await http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1,
                                                 "prompt_logprobs": 21})
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith(
        "Requested prompt logprobs of 21, which is greater than max allowed: 20")


async def test_chat_prompt_logprobs_score_the_rendered_prompt(http):
    """As completions' `prompt_logprobs`, over the chat template's tokens (the response's top
    level); over the max is the same 400; streamed is refused before the request runs."""
    body = {"messages": [{"role": "user", "content": "Hello world"}], "max_tokens": 2,
            "return_token_ids": True}
    r = (await http.post("/v1/chat/completions", json={**body, "prompt_logprobs": 2})).json()
    ids, plp = r["prompt_token_ids"], r["prompt_logprobs"]
    assert len(ids) > 5 and len(plp) == len(ids) and plp[0] is None
    for entry, token in zip(plp[1:], ids[1:], strict=True):
        assert len(entry) == 2 and entry[str(token)]["rank"] == 1
    assert (await http.post("/v1/chat/completions", json=body)).json()["prompt_logprobs"] \
        is None
    over = await http.post("/v1/chat/completions", json={**body, "prompt_logprobs": 21})
    assert over.status_code == 400 and over.json()["error"]["message"].startswith(
        "Requested prompt logprobs of 21, which is greater than max allowed: 20")
    streamed = await http.post("/v1/chat/completions",
                               json={**body, "prompt_logprobs": 1, "stream": True})
    assert streamed.status_code == 400


async def test_return_tokens_as_token_ids_names_the_ids(http):
    r = (await http.post("/v1/completions", json={
        "prompt": "Hello", "max_tokens": 3, "ignore_eos": True, "logprobs": 2,
        "return_tokens_as_token_ids": True, "return_token_ids": True})).json()["choices"][0]
    assert r["logprobs"]["tokens"] == [f"token_id:{t}" for t in r["token_ids"]]
    assert all(k.startswith("token_id:") for top in r["logprobs"]["top_logprobs"] for k in top)
    chat = (await http.post("/v1/chat/completions", json={
        **CHAT_BODY, "logprobs": True, "top_logprobs": 1, "return_tokens_as_token_ids": True,
        "return_token_ids": True})).json()["choices"][0]
    content = chat["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{t}" for t in chat["token_ids"]]
    # vLLM: an entry's bytes are its token's text (Logprob.decoded_token), its alternatives'
    # bytes their "token_id:N" names
    assert b"".join(bytes(c["bytes"]) for c in content).decode() == chat["message"]["content"]
    assert all(a["bytes"] == list(a["token"].encode())
               for c in content for a in c["top_logprobs"])


async def test_a_request_asking_prompt_logprobs_reads_nothing_from_the_prefix_cache(http):
    """vLLM's `skip_reading_prefix_cache`: set by `prompt_logprobs` (or `echo` with logprobs),
    the prompt is computed whole; the same prompt without them is served from the cache."""
    prompt = "A long shared prompt that fills several KV blocks of sixteen tokens. " * 8

    async def cached(**extra) -> int:
        r = await http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1,
                                                     **extra})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    await cached()  # (now in the cache)
    assert await cached() >= 64
    assert await cached(prompt_logprobs=1) == 0
    assert await cached(echo=True, logprobs=1) == 0
    assert await cached() >= 64  # (and it stays cached for the others)
