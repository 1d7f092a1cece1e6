"""The Responses API with vLLM's response store on (`VLLM_ENABLE_RESPONSES_API_STORE=1`),
through the official `openai` client: a conversation continued by `previous_response_id` is the
chat conversation vLLM builds (and hits the prefix cache), stored responses are fetched again,
background responses complete, replay their stream from `starting_after` after the client left,
and are cancelled with their KV freed; a stored response is never cancelled."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from fleets import assert_released, fleet_doc
from server_proc import ServerProcess

from clients.client import AsyncClient

MODEL = "llama-3.1-8b"  # the test fleet's default deployment ("fast") serves it
SLOW = "llama-3.1-70b"  # ~15 ms of wall time a token
FIRST = "The quick brown fox jumps over the lazy dog. Name a colour, please."


@pytest.fixture(scope="module")
def store_server():
    # one front end: each front end has its own store, as each of vLLM's API servers has
    with ServerProcess(fleet_doc({"api_server_count": 1}),
                       env={"VLLM_ENABLE_RESPONSES_API_STORE": "1"}) as server:
        yield server


@pytest.fixture
async def oai(store_server) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{store_server.http_url}/v1", api_key="none",
                                  max_retries=0, timeout=30) as c:
        yield c


@pytest.fixture
async def http(store_server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=store_server.http_url, timeout=30) as c:
        yield c


@pytest.fixture
async def client(store_server) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(store_server.target) as c:
        yield c


async def settled(oai: openai.AsyncOpenAI, response_id: str, timeout: float = 30.0):
    """The stored response once its background run has ended."""
    deadline = time.monotonic() + timeout
    while (r := await oai.responses.retrieve(response_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, f"{response_id} still {r.status}"
        await asyncio.sleep(0.02)
    return r


async def test_a_continued_conversation_is_vllms_chat_history(oai, client):
    first = await oai.responses.create(model=MODEL, instructions="Be brief.", input=FIRST,
                                       max_output_tokens=8)
    assert (await oai.responses.retrieve(first.id)).output_text == first.output_text
    second = await oai.responses.create(model=MODEL, input="And another one?",
                                        max_output_tokens=8, previous_response_id=first.id)
    # vLLM's history: the stored messages (instructions included), the answer's text, then
    # the new input — exactly this chat conversation
    chat = await oai.chat.completions.create(model=MODEL, max_tokens=8, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": FIRST},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And another one?"}])
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.output_text == chat.choices[0].message.content
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens // 16 * 16
    unstored = await oai.responses.create(model=MODEL, input=FIRST, max_output_tokens=2,
                                          store=False)
    with pytest.raises(openai.NotFoundError):
        await oai.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError) as e:  # a finished response is not cancelled
        await oai.responses.cancel(first.id)
    assert "Cannot cancel a synchronous response." in e.value.message
    await assert_released(client, "fast")


async def test_a_background_response_completes_as_a_foreground_one(oai, client):
    queued = await oai.responses.create(model=MODEL, input=FIRST, max_output_tokens=12,
                                        background=True)
    assert queued.status == "queued" and queued.output == [] and queued.background
    done = await settled(oai, queued.id)
    fore = await oai.responses.create(model=MODEL, input=FIRST, max_output_tokens=12,
                                      store=False)
    assert done.status == fore.status and done.output_text == fore.output_text
    assert done.usage.output_tokens == fore.usage.output_tokens
    await assert_released(client, "fast")


async def test_a_background_stream_is_replayed_after_its_client_left(http, oai, client):
    body = {"model": SLOW, "input": FIRST, "max_output_tokens": 24, "stream": True,
            "background": True, "temperature": 0}
    seen: list[dict] = []
    async with http.stream("POST", "/v1/responses", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line.removeprefix("data: ")))
                if len(seen) == 4:
                    break  # the client leaves; the generation goes on
    rid = seen[0]["response"]["id"]
    done = await settled(oai, rid)
    assert done.status in ("completed", "incomplete")
    rest: list[dict] = []
    async with http.stream("GET", f"/v1/responses/{rid}",
                           params={"stream": "true", "starting_after": 3}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                rest.append(json.loads(line.removeprefix("data: ")))
    events = seen + rest
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == done.output_text == events[-1]["response"]["output"][0]["content"][0]["text"]
    await assert_released(client, "slow")
    stored = await oai.responses.create(model=MODEL, input="x", max_output_tokens=1)
    r = await http.get(f"/v1/responses/{stored.id}", params={"stream": "true"})
    assert r.status_code == 400 and "Unknown response_id" in r.json()["error"]["message"]


async def test_a_cancelled_background_response_frees_its_blocks(oai, client):
    queued = await oai.responses.create(model=SLOW, input=FIRST, max_output_tokens=2000,
                                        background=True)
    cancelled = await oai.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert (await oai.responses.retrieve(queued.id)).status == "cancelled"  # stays so
    await assert_released(client, "slow")
    with pytest.raises(openai.BadRequestError):
        await oai.responses.cancel(queued.id)


def test_a_background_response_running_at_shutdown_ends_with_the_server():
    """SIGTERM while a background response generates: the drain's grace ends it (its engine
    request aborted as every other's), its task ends, and the server exits 0 with no task
    left pending."""
    server = ServerProcess(fleet_doc({"api_server_count": 1, "drain_grace_s": 0.2}),
                           env={"VLLM_ENABLE_RESPONSES_API_STORE": "1"}).start()
    try:
        r = httpx.post(f"{server.http_url}/v1/responses", timeout=30, json={
            "model": SLOW, "input": FIRST, "max_output_tokens": 2000, "background": True})
        assert r.status_code == 200 and r.json()["status"] == "queued"
    finally:
        code = server.stop()
    log = "\n".join(server.lines)
    assert code == 0, log[-3000:]
    assert "Traceback" not in log and "was destroyed but it is pending" not in log
