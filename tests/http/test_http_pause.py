"""vLLM's RL routes on a pod started with VLLM_SERVER_DEV_MODE=1: `/pause` in its three modes
(abort ends everything and refuses new requests with a retryable 503; wait lets the running
request finish, holds the queued one and refuses new ones; keep freezes every request and
queues new ones), `/resume`, `/is_paused`, the prefix cache emptied or kept, and
`/abort_requests` by id and for all — every request released afterwards; a pause waiting on
an engine that dies fails (500) instead of hanging. Without the variable the routes do not
exist, as in vLLM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
from fleets import assert_released, fleet_doc
from http_helpers import http_client
from server_proc import ServerProcess, metric, until

from clients.client import AsyncClient
from server.engine_proc.pause import PAUSED_MESSAGE

MODEL = "llama-3.1-8b"
# one sequence at a time, ~6 ms of wall time a token: a second request queues behind the first
POD = {"name": "pod", "model": MODEL, "quant": "bf16", "chip": "h100-sxm", "engine": "vllm",
       "max_model_len": 1024, "max_num_seqs": 1}
DEV = {"VLLM_SERVER_DEV_MODE": "1"}
PROMPT = [(7 * i) % 3000 + 100 for i in range(96)]


def doc() -> dict:
    return fleet_doc({"time_scale": 1.0, "api_server_count": 1, "drain_grace_s": 1.0}, [POD])


@pytest.fixture(scope="module")
def server():
    with ServerProcess(doc(), env=DEV) as s:
        yield s


@pytest.fixture
async def client(server) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.target) as c:
        yield c


def body(max_tokens: int, stream: bool = False, prompt=PROMPT) -> dict:
    usage = {"stream_options": {"include_usage": True}} if stream else {}
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "stream": stream, **usage}


class Stream:
    """A streamed completion read in a task: its first chunk awaited, its finish and its
    completion tokens (the usage chunk's: a chunk may carry several tokens) kept."""

    def __init__(self, http: httpx.AsyncClient, max_tokens: int, rid: str | None = None):
        self.http, self.max_tokens, self.rid = http, max_tokens, rid
        self.started = asyncio.Event()
        self.tokens, self.finish = 0, None
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        headers = {"X-Request-Id": self.rid} if self.rid else {}
        async with self.http.stream("POST", "/v1/completions", json=body(self.max_tokens, True),
                                    headers=headers) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line.removeprefix("data: "))
                if "error" in event:  # the engine died under the stream
                    self.finish = "error"
                    continue
                if event.get("usage"):
                    self.tokens = event["usage"]["completion_tokens"]
                for choice in event["choices"]:
                    self.finish = choice["finish_reason"] or self.finish
                self.started.set()

    async def ended(self) -> str:
        await asyncio.wait_for(self.task, 60)
        return self.finish


async def queued(client: AsyncClient, n: int) -> None:
    await until(client, "pod", lambda d: d.load.num_waiting == n)


async def running_and_queued(http: httpx.AsyncClient, client: AsyncClient, tokens: int,
                             queued_tokens: int) -> tuple[Stream, asyncio.Task]:
    """A streamed request running and, behind it (one seat), a plain one queued."""
    running = Stream(http, tokens)
    await running.started.wait()
    held = asyncio.create_task(http.post("/v1/completions", json=body(queued_tokens)))
    await queued(client, 1)
    return running, held


async def refused_as_paused(http: httpx.AsyncClient) -> None:
    for stream in (False, True):
        r = await http.post("/v1/completions", json=body(4, stream))
        assert r.status_code == 503, r.text
        assert r.json()["error"] == {"message": PAUSED_MESSAGE, "type": "ServiceUnavailableError",
                                     "param": None, "code": 503}


async def test_abort_ends_everything_and_refuses_until_resumed(server, client):
    async with http_client(server) as http:
        running, waiting = await running_and_queued(http, client, 400, 8)
        r = await http.post("/pause")
        assert r.status_code == 200 and r.json() == {"status": "paused"}
        assert await running.ended() == "abort" and running.tokens < 400
        assert (await waiting).json()["choices"][0]["finish_reason"] == "abort"
        assert (await http.get("/is_paused")).json() == {"is_paused": True}
        await refused_as_paused(http)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            async for _ in client.generate("Hi", deployment="pod", max_tokens=2):
                pass
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert PAUSED_MESSAGE in (e.value.details() or "")
        await assert_released(client, "pod")
        r = await http.post("/resume")
        assert r.status_code == 200 and r.json() == {"status": "resumed"}
        assert (await http.get("/is_paused")).json() == {"is_paused": False}
        r = await http.post("/v1/completions", json=body(4))
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    await assert_released(client, "pod")


async def test_wait_lets_the_running_request_finish_and_holds_the_queued_one(server, client):
    async with http_client(server) as http:
        running, held = await running_and_queued(http, client, 60, 100)
        r = await http.post("/pause", params={"mode": "wait"})
        assert r.status_code == 200 and r.json() == {"status": "paused"}
        # the pause answered once the running request had ended in the engine
        d = await client.get_deployment("pod")
        assert d.load.num_running == 0 and d.load.num_waiting == 1
        made = metric(server.scrape(), "vllm:generation_tokens_total")
        assert await running.ended() == "length" and running.tokens == 60
        await refused_as_paused(http)
        # the queued request stays queued (vLLM's PAUSED_NEW): nothing more was generated
        d = await client.get_deployment("pod")
        assert d.load.num_running == 0 and d.load.num_waiting == 1 and not held.done()
        assert metric(server.scrape(), "vllm:generation_tokens_total") == made
        assert (await http.post("/resume")).status_code == 200
        r = await held
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["usage"]["completion_tokens"] == 100
    await assert_released(client, "pod")


async def test_keep_freezes_every_request_and_queues_new_ones(server, client):
    async with http_client(server) as http:
        frozen = Stream(http, 60)
        await frozen.started.wait()
        r = await http.post("/pause", params={"mode": "keep"})
        assert r.status_code == 200 and r.json() == {"status": "paused"}
        made = metric(server.scrape(), "vllm:generation_tokens_total")
        later = Stream(http, 8)  # accepted (not refused) and queued
        await queued(client, 1)
        d = await client.get_deployment("pod")
        assert d.load.num_running == 1  # frozen in place, not aborted
        assert metric(server.scrape(), "vllm:generation_tokens_total") == made
        assert (await http.get("/is_paused")).json() == {"is_paused": True}
        assert (await http.post("/resume")).status_code == 200
        assert await frozen.ended() == "length" and frozen.tokens == 60
        assert await later.ended() == "length" and later.tokens == 8
    await assert_released(client, "pod")


async def test_a_keep_pause_releases_the_kv_cache_preempting_the_frozen_request(server, client):
    """vLLM's release_kv_cache_memory counts no request of a paused scheduler (PAUSED_ALL):
    the frozen one is preempted with the release and recomputes after the wake-up."""
    async with http_client(server) as http:
        frozen = Stream(http, 60)
        await frozen.started.wait()
        assert (await http.post("/pause", params={"mode": "keep"})).status_code == 200
        r = await http.post("/release_kv_cache_memory")
        assert r.status_code == 200 and r.json() == {"status": "kv_cache_released"}
        d = await client.get_deployment("pod")
        assert d.load.num_running == 0 and d.load.num_waiting == 1
        assert d.capacity.kv_blocks_free == d.capacity.kv_blocks_total
        assert (await http.post("/wake_up")).json()["status"] == "awake"
        assert await frozen.ended() == "length" and frozen.tokens == 60
    await assert_released(client, "pod")


@pytest.mark.parametrize("clear_cache", [False, True])
async def test_the_prefix_cache_is_emptied_unless_kept(server, client, clear_cache):
    prompt = [(13 * i + clear_cache) % 3000 + 200 for i in range(160)]
    async with http_client(server) as http:
        assert (await http.post("/v1/completions", json=body(2, prompt=prompt))).status_code == 200
        r = await http.post("/pause", params={"clear_cache": str(clear_cache).lower()})
        assert r.status_code == 200
        assert (await http.post("/resume")).status_code == 200
        hits = metric(server.scrape(), "vllm:prefix_cache_hits_total")
        assert (await http.post("/v1/completions", json=body(2, prompt=prompt))).status_code == 200
        gained = metric(server.scrape(), "vllm:prefix_cache_hits_total") - hits
    assert (gained == 0) == clear_cache, gained
    await assert_released(client, "pod")


async def test_abort_requests_by_id_and_for_all(server, client):
    async with http_client(server) as http:
        first = Stream(http, 400, rid="first")
        await first.started.wait()
        second = Stream(http, 8, rid="second")
        await queued(client, 1)
        r = await http.post("/abort_requests", json={"request_ids": ["cmpl-first"]})
        assert r.status_code == 200 and r.json() == {"status": "aborted", "aborted": 1}
        assert await first.ended() == "abort"
        assert await second.ended() == "length" and second.tokens == 8
        third, fourth = Stream(http, 400, rid="third"), Stream(http, 400, rid="fourth")
        await third.started.wait()
        await queued(client, 1)
        r = await http.post("/abort_requests", json={})
        assert r.status_code == 200 and r.json() == {"status": "aborted", "aborted": 2}
        assert await third.ended() == "abort" and await fourth.ended() == "abort"
        for content, message in ((b"{", "Invalid JSON format"),
                                 (b"[]", "Request body must be a JSON object"),
                                 (b'{"request_ids": 5}', "request_ids must be a list of strings")):
            r = await http.post("/abort_requests", content=content)
            assert r.status_code == 400 and r.json()["error"]["message"] == message
    await assert_released(client, "pod")


async def test_a_bad_mode_is_refused_as_vllm_validates_it(server):
    async with http_client(server) as http:
        r = await http.post("/pause", params={"mode": "later"})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "query.mode"
        assert "Input should be 'abort', 'wait' or 'keep'" in r.json()["error"]["message"]
        assert (await http.get("/is_paused")).json() == {"is_paused": False}


async def test_sigterm_while_frozen_stops_cleanly():
    with ServerProcess(doc(), env=DEV) as s:
        async with http_client(s) as http:
            frozen = Stream(http, 400)
            await frozen.started.wait()
            assert (await http.post("/pause", params={"mode": "keep"})).status_code == 200
            s.signal()
            assert await frozen.ended() == "abort"
        assert s.stop() == 0


async def test_a_pause_waiting_on_an_engine_that_dies_fails_instead_of_hanging():
    with ServerProcess(doc(), env=DEV) as s:
        async with http_client(s) as http:
            running = Stream(http, 400)
            await running.started.wait()
            pause = asyncio.create_task(http.post("/pause", params={"mode": "wait"}))
            await until_paused(http)  # the engine holds the pause, waiting for the request
            os.kill(s.engine_pid("pod"), signal.SIGKILL)
            r = await asyncio.wait_for(pause, 30)
            assert r.status_code == 500, r.text
            assert r.json()["error"].startswith("Failed to pause generation: ")
            assert "killed by SIGKILL" in r.json()["error"]
            assert await running.ended() == "error"  # the stream it waited for failed too


async def until_paused(http: httpx.AsyncClient) -> None:
    for _ in range(500):
        if (await http.get("/is_paused")).json()["is_paused"]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the engine never paused")


async def test_the_routes_exist_only_in_dev_mode():
    with ServerProcess(doc()) as s:
        async with http_client(s) as http:
            for method, path in (("POST", "/pause"), ("POST", "/resume"),
                                 ("GET", "/is_paused"), ("POST", "/abort_requests"),
                                 ("POST", "/update_weight_version"), ("GET", "/weight_info"),
                                 ("GET", "/get_world_size")):
                assert (await http.request(method, path)).status_code == 404, path
