"""vLLM's batch chat completions (`/v1/chat/completions/batch`): choice i is what
`/v1/chat/completions` answers for conversation i (text, token ids, logprobs, finish), the
shared fields apply to each conversation, usage sums them, the answer is never streamed,
vLLM's refusals, and a client that leaves frees every conversation's blocks."""

from __future__ import annotations

import socket

from fleets import assert_released

MODEL = "llama-3.1-8b"  # the test fleet's default deployment ("fast") serves it
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour"}],
    [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "One, two,"}],
]
SHARED = {"max_tokens": 12, "logprobs": True, "top_logprobs": 2, "return_token_ids": True,
          "temperature": 0.7, "seed": 5}


async def test_each_choice_is_the_chat_answer_to_its_conversation(http, client):
    r = await http.post("/v1/chat/completions/batch", json={
        "model": MODEL, "messages": CONVERSATIONS, **SHARED}, headers={"X-Request-Id": "bb"})
    assert r.status_code == 200, r.text
    batch = r.json()
    assert batch["id"] == "chatcmpl-bb" and batch["object"] == "chat.completion"
    assert r.headers["x-request-id"] == "bb"
    assert [c["index"] for c in batch["choices"]] == [0, 1, 2]
    prompt = completion = 0
    for conv, choice in zip(CONVERSATIONS, batch["choices"], strict=True):
        one = (await http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": conv, **SHARED})).json()
        alone = one["choices"][0]
        for key in ("message", "finish_reason", "token_ids", "logprobs", "stop_reason"):
            assert choice[key] == alone[key], key
        prompt += one["usage"]["prompt_tokens"]
        completion += one["usage"]["completion_tokens"]
    assert batch["usage"]["prompt_tokens"] == prompt
    assert batch["usage"]["completion_tokens"] == completion
    assert batch["usage"]["total_tokens"] == prompt + completion
    assert batch["prompt_token_ids"] is None  # no prompt-level fields in a batch answer
    await assert_released(client, "fast")


async def test_shared_fields_apply_to_every_conversation_and_nothing_streams(http, client):
    r = await http.post("/v1/chat/completions/batch", json={
        "messages": CONVERSATIONS, "stream": True, "max_tokens": 3,
        "structured_outputs": {"choice": ["red", "green", "blue"]}})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    choices = r.json()["choices"]
    assert len(choices) == 3
    assert all(c["message"]["content"] in ("red", "green", "blue") for c in choices)
    r = await http.post("/v1/chat/completions/batch", json={
        "messages": CONVERSATIONS, "max_tokens": 2, "ignore_eos": True})
    assert [c["finish_reason"] for c in r.json()["choices"]] == ["length"] * 3
    assert r.json()["usage"]["completion_tokens"] == 6
    await assert_released(client, "fast")


async def test_vllm_refusals(http):
    one = [[{"role": "user", "content": "x"}]]
    cases = [
        ({"messages": one, "n": 2}, "n",
         "Batch chat completions do not support `n > 1`. Please set `n` to 1."),
        ({"messages": one, "use_beam_search": True}, "use_beam_search",
         "Batch chat completions do not support beam search."),
        ({"messages": one, "tool_choice": "auto"}, "body.tool_choice", "Input should be 'none'"),
        ({"messages": []}, "body.messages", "List should have at least 1 item"),
        ({"messages": [one[0], []]}, "body.messages.1", "List should have at least 1 item"),
        ({"messages": [one[0], [{"content": "no role"}]]}, "body.messages.1.0.role",
         "Field required"),
        ({"messages": one, "top_logprobs": 2}, "top_logprobs",
         "when using `top_logprobs`, `logprobs` must be set to true."),  # each one's chat check
        ({"messages": one, "model": "nope"}, "model", "The model `nope` does not exist."),
    ]
    for body, param, words in cases:
        r = await http.post("/v1/chat/completions/batch", json=body)
        assert r.status_code in (400, 404), (body, r.text)
        error = r.json()["error"]
        assert error["param"] == param and words in error["message"], (body, error)


async def test_a_client_that_leaves_frees_every_conversation(server, client):
    body = (b'{"model": "llama-3.1-70b", "max_tokens": 2000, "ignore_eos": true, "messages": '
            b'[[{"role": "user", "content": "first"}], [{"role": "user", "content": "second"}]]}')
    with socket.create_connection(("127.0.0.1", server.http_port)) as s:
        s.sendall(b"POST /v1/chat/completions/batch HTTP/1.1\r\nHost: x\r\n"
                  b"X-Request-Id: leaving\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        server.wait_for_log(r"request_id=chatcmpl-leaving_1-[0-9a-f]{8}\] queued on slow")
    for i in (0, 1):
        server.wait_for_log(rf"request_id=chatcmpl-leaving_{i}-[0-9a-f]{{8}}\] finished on "
                            r"slow: abort", timeout=10)
    await assert_released(client, "slow")
