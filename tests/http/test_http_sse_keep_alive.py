"""vLLM 0.34.0's `--sse-keep-alive-interval` (server/http/sse_keep_alive.py): a streamed
completion or chat answer that sends nothing for the interval (here: queued behind a paused
engine) sends `: keep-alive` comments, then its events as before; the official `openai` client
reads such a stream; a client that leaves while only comments flow releases its request; a
negative interval is vLLM's start-up error. The wrapper's contract is checked on its own."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import openai
import pytest
from fleets import assert_released, fleet_doc
from http_helpers import http_client
from server_proc import ServerProcess

from clients.client import AsyncClient
from server.http.sse_keep_alive import KEEP_ALIVE, with_sse_keep_alive

MODEL = "llama-3.1-8b"
POD = {"name": "pod", "model": MODEL, "quant": "bf16", "chip": "h100-sxm", "engine": "vllm",
       "max_model_len": 1024}
DEV = {"VLLM_SERVER_DEV_MODE": "1"}  # /pause and /resume (vLLM's RL routes)
COMMENT = KEEP_ALIVE.decode().strip()  # ": keep-alive"


@pytest.fixture(scope="module")
def server():
    doc = fleet_doc({"time_scale": 1.0, "api_server_count": 1, "sse_keep_alive_interval": 1},
                    [POD])
    with ServerProcess(doc, env=DEV) as s:
        yield s


async def read_until_comments(lines, n: int) -> list[str]:
    """The stream's lines up to its `n`-th keep-alive comment."""
    seen: list[str] = []
    async for line in lines:
        seen.append(line)
        if seen.count(COMMENT) == n:
            return seen
    raise AssertionError(f"the stream ended after {seen.count(COMMENT)} comments: {seen}")


@pytest.mark.parametrize("path, extra", [
    ("/v1/completions", {"prompt": "Tell me a story"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story"}]}),
])
async def test_an_idle_stream_sends_keep_alive_comments_then_its_events(server, path, extra):
    async with http_client(server) as http, AsyncClient(server.target) as client:
        assert (await http.post("/pause", params={"mode": "keep"})).status_code == 200
        body = {"model": MODEL, "max_tokens": 5, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}, **extra}
        async with http.stream("POST", path, json=body, timeout=120) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            idle = await asyncio.wait_for(read_until_comments(lines, 2), 60)
            assert all(line in ("", COMMENT) or line.startswith("data: ") for line in idle)
            assert (await http.post("/resume")).status_code == 200
            rest = [line async for line in lines]
        events = [json.loads(line[6:]) for line in idle + rest
                  if line.startswith("data: ") and line != "data: [DONE]"]
        assert rest[-2:] == ["data: [DONE]", ""]
        assert events[-1]["usage"]["completion_tokens"] == 5  # the usage chunk, last
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        await assert_released(client, "pod")


async def test_the_openai_client_reads_a_stream_with_comments(server):
    oai = openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="none")
    async with http_client(server) as http, AsyncClient(server.target) as client:
        assert (await http.post("/pause", params={"mode": "keep"})).status_code == 200

        async def sdk() -> tuple[str, int]:
            """The text and the usage chunk's token count (a chunk may carry several)."""
            stream = await oai.completions.create(
                model=MODEL, prompt="Once", max_tokens=4, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            chunks = [c async for c in stream]
            return ("".join(c.choices[0].text for c in chunks if c.choices),
                    chunks[-1].usage.completion_tokens)

        task = asyncio.create_task(sdk())
        async with http.stream("POST", "/v1/completions", json={  # a witness, started after
                "model": MODEL, "prompt": "Twice", "max_tokens": 1, "stream": True}) as r:
            await asyncio.wait_for(read_until_comments(r.aiter_lines(), 2), 60)
            assert (await http.post("/resume")).status_code == 200
        text, tokens = await asyncio.wait_for(task, 60)  # idle as long: comments included
        assert tokens == 4 and text.strip()
        await assert_released(client, "pod")
    await oai.close()


async def test_a_client_gone_during_comments_releases_its_request(server):
    async with http_client(server) as http, AsyncClient(server.target) as client:
        assert (await http.post("/pause", params={"mode": "keep"})).status_code == 200
        body = {"model": MODEL, "prompt": "Bye", "max_tokens": 50, "stream": True}
        async with http.stream("POST", "/v1/completions", json=body) as r:
            await asyncio.wait_for(read_until_comments(r.aiter_lines(), 1), 60)
        # the connection closed: the server aborts the request, even while paused
        await assert_released(client, "pod")
        assert (await http.post("/resume")).status_code == 200


def test_a_negative_interval_is_refused_in_vllms_words():
    cmd = [sys.executable, "-m", "doppelchip.cli", "serve", "--deployment", "vllm-h100",
           "--port", "0", "--http-port", "0", "--sse-keep-alive-interval", "-1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert ("--sse-keep-alive-interval must be a non-negative integer (0 disables keep-alive "
            "comments)") in done.stderr


# ---- the wrapper on its own ----------------------------------------------------------------

class Source:
    """An event stream the test feeds; it records being closed."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.closed = False

    async def events(self):
        try:
            while (event := await self.queue.get()) is not None:
                if event == b"boom":
                    raise RuntimeError("boom")
                yield event
        finally:
            self.closed = True


async def test_without_an_interval_the_stream_is_returned_unchanged():
    src = Source().events()
    assert with_sse_keep_alive(src, 0) is src
    assert with_sse_keep_alive(src, float("inf")) is src


async def test_comments_only_between_the_events_in_their_order():
    source = Source()
    wrapped = with_sse_keep_alive(source.events(), 0.01)
    assert await anext(wrapped) == KEEP_ALIVE  # nothing fed: idle
    for e in (b"data: 1\n\n", b"data: 2\n\n", None):
        await source.queue.put(e)
    rest = [e async for e in wrapped]
    assert [e for e in rest if e != KEEP_ALIVE] == [b"data: 1\n\n", b"data: 2\n\n"]
    assert source.closed


async def test_closing_the_wrapper_closes_the_stream_and_errors_pass_through():
    for fed in ([], [b"data: 1\n\n"]):  # closed while idle, or right after an event
        source = Source()
        wrapped = with_sse_keep_alive(source.events(), 0.01)
        for e in fed:
            await source.queue.put(e)
        first = await anext(wrapped)
        while fed and first == KEEP_ALIVE:
            first = await anext(wrapped)
        assert first == (fed[0] if fed else KEEP_ALIVE)
        await wrapped.aclose()  # the client gone: the stream's `finally` runs
        assert source.closed
    failing = Source()
    wrapped = with_sse_keep_alive(failing.events(), 0.01)
    await failing.queue.put(b"boom")
    with pytest.raises(RuntimeError, match="boom"):
        while True:
            await anext(wrapped)
    assert failing.closed
