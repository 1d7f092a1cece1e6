"""The official `openai` client against doppelchip's own HTTP: completions and chat, streaming
and not, exact usage, prefix-cache hits in `prompt_tokens_details`, n > 1."""

from __future__ import annotations

from fleets import assert_released
from http_helpers import TOK, retokenized

MODEL = "llama-3.1-8b"  # the test fleet's default deployment ("fast") serves it


async def tokens_of(http, **body) -> int:
    r = await http.post("/tokenize", json=body)
    assert r.status_code == 200
    return r.json()["count"]


async def test_completion_usage_is_exact(oai, http, client):
    prompt = "The quick brown fox jumps over the lazy dog."
    r = await oai.completions.create(model=MODEL, prompt=prompt, max_tokens=24,
                                     extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.model == MODEL and r.id.startswith("cmpl-")
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.index == 0
    assert r.usage.completion_tokens == 24
    assert r.usage.prompt_tokens == await tokens_of(http, prompt=prompt)
    assert r.usage.total_tokens == r.usage.prompt_tokens + 24
    # the text a client received re-tokenizes to what the server generated
    assert retokenized(choice.text) == 24
    await assert_released(client, "fast")


async def test_completion_stream_matches_non_stream(oai, client):
    kwargs = dict(model=MODEL, prompt="Stream me something", max_tokens=30, seed=7)
    whole = await oai.completions.create(**kwargs)
    stream = await oai.completions.create(**kwargs, stream=True,
                                          stream_options={"include_usage": True})
    texts, finishes, usage = [], [], None
    async for chunk in stream:
        if chunk.choices:
            texts.append(chunk.choices[0].text)
            finishes.append(chunk.choices[0].finish_reason)
        else:
            usage = chunk.usage
    assert "".join(texts) == whole.choices[0].text
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) <= {None}
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    await assert_released(client, "fast")


async def test_chat_usage_exact_and_prefix_cache_reported(oai, http, client):
    messages = [{"role": "system", "content": "You are terse. " * 40},
                {"role": "user", "content": "Say something."}]
    first = await oai.chat.completions.create(model=MODEL, messages=messages,
                                              max_completion_tokens=12,
                                              extra_body={"ignore_eos": True})
    assert first.object == "chat.completion" and first.id.startswith("chatcmpl-")
    msg = first.choices[0].message
    assert msg.role == "assistant" and msg.content and not msg.tool_calls
    assert first.usage.completion_tokens == 12 == retokenized(msg.content)
    assert first.usage.prompt_tokens == await tokens_of(http, messages=messages)
    again = await oai.chat.completions.create(model=MODEL, messages=messages,
                                              max_completion_tokens=12,
                                              extra_body={"ignore_eos": True})
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert 0 < cached < again.usage.prompt_tokens  # whole blocks of the prompt were cached
    await assert_released(client, "fast")


async def test_chat_stream_role_chunk_content_and_usage(oai, client):
    stream = await oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello!"}], max_tokens=20,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert retokenized(content) == 20
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    await assert_released(client, "fast")


async def test_n_choices_differ_and_share_the_prompt(oai, client):
    r = await oai.completions.create(model=MODEL, prompt="Three ways to say it", n=3,
                                     max_tokens=16, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert len({c.text for c in r.choices}) == 3  # different seeds
    assert r.usage.completion_tokens == 48
    assert r.usage.prompt_tokens == len(TOK.encode("Three ways to say it")) + 1  # BOS, once
    await assert_released(client, "fast")


async def test_n_streaming_indexes_every_choice(oai, client):
    stream = await oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "two please"}], n=2,
        max_tokens=10, stream=True, extra_body={"ignore_eos": True})
    texts: dict[int, str] = {0: "", 1: ""}
    finished = {}
    async for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished[c.index] = c.finish_reason
    assert finished == {0: "length", 1: "length"}
    assert texts[0] != texts[1] and retokenized(texts[0]) == retokenized(texts[1]) == 10
    await assert_released(client, "fast")


async def test_seeded_requests_repeat(oai):
    kw = dict(model=MODEL, prompt="determinism", max_tokens=12, seed=42)
    a, b = await oai.completions.create(**kw), await oai.completions.create(**kw)
    c = await oai.completions.create(**{**kw, "seed": 43})
    assert a.choices[0].text == b.choices[0].text != c.choices[0].text


async def test_stop_string_ends_the_choice(oai):
    base = await oai.completions.create(model=MODEL, prompt="stop here", max_tokens=20,
                                        seed=3, extra_body={"ignore_eos": True})
    word = base.choices[0].text.split()[3]
    r = await oai.completions.create(model=MODEL, prompt="stop here", max_tokens=20, seed=3,
                                     stop=[word], extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == base.choices[0].text.split(word)[0]
    assert r.choices[0].model_extra["stop_reason"] == word
