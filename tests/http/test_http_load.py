"""vLLM's GET /load: `{"server_load": N}`, the completions, chat, Messages, Responses and
/invocations requests one front end has in flight, counted only with
--enable-server-load-tracking (0 without, as vLLM)."""

from __future__ import annotations

import asyncio

import httpx
from fleets import assert_released, fleet_doc
from http_helpers import first_data
from server_proc import ServerProcess

from clients.client import AsyncClient

SLOW = {"model": "llama-3.1-70b", "max_tokens": 2000, "ignore_eos": True}  # ~30 s of wall time
CHAT = {"messages": [{"role": "user", "content": "wait"}], "stream": True, **SLOW}
MESSAGE = {"model": "llama-3.1-70b", "max_tokens": 2000, "stream": True,  # Anthropic's API
           "messages": [{"role": "user", "content": "wait"}]}
RESPONSE = {"model": "llama-3.1-70b", "max_output_tokens": 2000, "stream": True,  # OpenAI's
            "input": "wait"}


async def load(h: httpx.AsyncClient) -> int:
    r = await h.get("/load")
    assert r.status_code == 200 and set(r.json()) == {"server_load"}, r.text
    return r.json()["server_load"]


async def until_load(h: httpx.AsyncClient, n: int) -> None:
    """Polls /load until it reads `n` (a response's count ends just after its last byte)."""
    for _ in range(1000):
        if await load(h) == n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"server_load never became {n}: {await load(h)}")


async def test_load_counts_requests_in_flight_until_their_response_ends():
    """Three streams (one running, two queued behind it on a one-sequence deployment) count 3
    from when their headers arrive; a refused request leaves nothing counted; a stream whose
    client leaves stops counting (a Responses, an /invocations and a token-in/token-out stream
    too), as does a non-streaming request whose client leaves (a batch chat request too)."""
    with ServerProcess(fleet_doc({"api_server_count": 1}), "--enable-server-load-tracking",
                       "--enable-scale-out") as server:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as h, \
                AsyncClient(server.target) as client:
            assert await load(h) == 0
            one = await h.send(h.build_request("POST", "/v1/completions", json={
                "prompt": "hold", "stream": True, **SLOW}), stream=True)
            kept = one.aiter_lines()
            await first_data(kept)
            two = await h.send(h.build_request("POST", "/v1/chat/completions", json=CHAT),
                               stream=True)
            three = await h.send(h.build_request("POST", "/v1/messages", json=MESSAGE),
                                 stream=True)
            assert await load(h) == 3  # the three handlers have answered their headers
            bad = await h.post("/v1/completions", json={"prompt": "x", "temperature": -1,
                                                        **SLOW})
            assert bad.status_code == 400
            await until_load(h, 3)
            await three.aclose()  # (first: it has no ignore_eos, and could end by itself)
            await until_load(h, 2)
            await one.aclose()
            await until_load(h, 1)
            await two.aclose()
            await until_load(h, 0)
            del kept
            # the aborts reach the engine after the responses end: wait for its queue to
            # empty, or the next request may find it full (max_waiting 2) and get a 429
            await assert_released(client, "slow")
            for path, body in (("/v1/responses", RESPONSE),
                               ("/invocations", {"prompt": "hold", "stream": True, **SLOW}),
                               ("/inference/v1/generate", {
                                   "model": SLOW["model"], "token_ids": [7, 8], "stream": True,
                                   "sampling_params": {"max_tokens": 2000,
                                                       "ignore_eos": True}})):
                four = await h.send(h.build_request("POST", path, json=body), stream=True)
                assert await load(h) == 1, path
                await four.aclose()
                await until_load(h, 0)
                await assert_released(client, "slow")
            await assert_released(client, "slow")
            waiting = asyncio.create_task(h.post("/v1/completions", json={"prompt": "w",
                                                                          **SLOW}))
            await until_load(h, 1)
            waiting.cancel()  # the client hangs up on a non-streaming request
            await until_load(h, 0)
            await assert_released(client, "slow")
            batch = asyncio.create_task(h.post("/v1/chat/completions/batch", json={
                "messages": [[{"role": "user", "content": "b"}]], **SLOW}))
            await until_load(h, 1)  # a batch chat request counts once, as vLLM's
            batch.cancel()
            await until_load(h, 0)
            await assert_released(client, "slow")


async def test_load_is_zero_without_tracking(server, client):
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as h:
        r = await h.send(h.build_request("POST", "/v1/completions", json={
            "prompt": "untracked", "stream": True, **SLOW}), stream=True)
        kept = r.aiter_lines()
        await first_data(kept)
        assert await load(h) == 0
        await r.aclose()
    await assert_released(client, "slow")
