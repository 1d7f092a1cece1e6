"""`priority` over HTTP, as vLLM: refused (400) by a deployment without priority scheduling;
under `policy = "priority"` the lowest value is served first."""

from __future__ import annotations

import asyncio

import httpx
from fleets import assert_released, fleet_doc
from server_proc import ServerProcess, until

from clients.client import AsyncClient

# one seat, a deep queue, llama.cpp's slow tokens: the queue order decides who runs next
QUEUED = {"name": "queued", "model": "llama-3.1-70b", "quant": "q4_k_m", "chip": "rtx-4090",
          "engine": "llama.cpp", "max_num_seqs": 1, "policy": "priority"}
FAST = {"name": "fast", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
        "engine": "vllm", "max_model_len": 256}


async def test_priority_needs_priority_scheduling_and_orders_the_queue():
    with ServerProcess(fleet_doc({"time_scale": 0.05}, [QUEUED, FAST])) as server:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as h, \
                AsyncClient(server.target) as client:
            r = await h.post("/v1/completions", json={"model": "llama-3.1-8b", "prompt": "p",
                                                      "max_tokens": 2, "priority": 1})
            assert r.status_code == 400
            assert "Priority scheduling is not enabled" in r.json()["error"]["message"]

            finished: list[str] = []

            async def one(name: str, priority: int, max_tokens: int) -> None:
                r = await h.post("/v1/completions", json={
                    "model": "llama-3.1-70b", "prompt": name, "max_tokens": max_tokens,
                    "ignore_eos": True, "priority": priority})
                assert r.status_code == 200, r.text
                finished.append(name)

            holder = asyncio.create_task(one("holder", 0, 120))  # takes the only seat
            await until(client, "queued", lambda d: d.load.num_running == 1)
            low = asyncio.create_task(one("low", 5, 2))
            await until(client, "queued", lambda d: d.load.num_waiting == 1)
            high = asyncio.create_task(one("high", -1, 2))
            await until(client, "queued", lambda d: d.load.num_waiting == 2)
            await asyncio.gather(holder, low, high)
            assert finished == ["holder", "high", "low"]  # high overtook low in the queue
            await assert_released(client, "queued")
