"""Storms against one real server (issue 14 #5): a cancellation storm over gRPC and HTTP, and a
burst far above a deployment's capacity. Bounded: 2,400 cancelled requests, 3,000 + 400 in the
burst, each in a few seconds of wall time. Seeded, so every run cancels at the same points.

What must hold: every request ends as the client made it end (finished, CANCELLED, deadline)
or, in the burst, OK or RESOURCE_EXHAUSTED / 429 with the admission-control message — never
CANCELLED before reaching a handler (grpc's pending-call backlog, `server/backlog.py`);
afterwards no request runs or waits, every KV block is free and the log holds no traceback.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import grpc
import httpx
import pytest
from documented import HEALTHY_HTTP
from server_proc import ServerProcess, end_at_random, released
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc
from test_faults_fuzz import FUZZ_FLEET, log_errors

from clients.client import AsyncClient, build_request

C = grpc.StatusCode


@pytest.fixture(scope="module")
def storm_server():
    with ServerProcess(FUZZ_FLEET) as s:
        yield s


async def _grpc_cancelled(client: AsyncClient, vllm, rng: random.Random, i: int) -> str:
    """One gRPC request ended by its client at a random point (before or after its first
    chunk, or by a deadline)."""
    how = rng.choice(("sleep", "chunks", "deadline"))
    if i % 3 == 0:
        call = vllm.Generate(vpb.GenerateRequest(
            request_id=f"storm-v{i}", tokenized=vpb.TokenizedInput(input_ids=[1, 2, 3]),
            stream=True, sampling_params=vpb.SamplingParams(max_tokens=200, ignore_eos=True)),
            timeout=rng.uniform(0.001, 0.2) if how == "deadline" else 30)
    else:
        call = client.stub.Generate(build_request(
            "storm", deployment="fast", request_id=f"storm-{i}", max_tokens=200,
            ignore_eos=True), timeout=rng.uniform(0.001, 0.2) if how == "deadline" else 30)
    return await end_at_random(call, how, rng)


async def _http_dropped(http: httpx.AsyncClient, rng: random.Random, i: int) -> str:
    """One HTTP request whose client disconnects at a random point."""
    body = {"model": "llama-3.1-8b", "prompt": "storm", "max_tokens": 200, "ignore_eos": True,
            "stream": rng.random() < 0.7}

    async def go() -> int:
        async with http.stream("POST", "/v1/completions", json=body,
                               headers={"X-Request-Id": f"storm-h{i}"}) as r:
            async for _ in r.aiter_lines():
                pass
            return r.status_code

    task = asyncio.create_task(go())
    await asyncio.sleep(rng.uniform(0, 0.15))
    task.cancel()
    try:
        return str(await task)
    except asyncio.CancelledError:
        return "dropped"


async def test_a_cancellation_storm_leaves_the_pool_idle(storm_server):
    rng = random.Random(14)
    ends: Counter = Counter()
    async with AsyncClient(storm_server.target) as client, \
            grpc.aio.insecure_channel(storm_server.target) as channel, \
            httpx.AsyncClient(base_url=storm_server.http_url, timeout=30,
                              limits=httpx.Limits(max_connections=200)) as http:
        vllm = vpb_grpc.VllmEngineStub(channel)
        for wave in range(8):  # 8 waves of 300: 200 gRPC + 100 HTTP
            base = wave * 300
            calls = [_grpc_cancelled(client, vllm, rng, base + i) for i in range(200)]
            calls += [_http_dropped(http, rng, base + i) for i in range(100)]
            ends.update(await asyncio.gather(*calls))
        assert sum(ends.values()) == 2400
        # RESOURCE_EXHAUSTED: VllmEngine fronts `tiny`, which queues 3 at most
        assert set(ends) <= {"OK", "CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED",
                             "dropped", "200"}, ends
        assert ends["CANCELLED"] + ends["DEADLINE_EXCEEDED"] + ends["dropped"] > 1200, ends
        for name in ("fast", "tiny"):
            await released(client, name, timeout=30)
    assert not (errors := log_errors(storm_server.log)), "\n".join(errors)


async def test_a_burst_above_capacity_is_answered_by_admission_control(storm_server):
    """3,000 concurrent Generate calls on one connection (the project's client) to `tiny`
    (2 running, 3 waiting) and 400 HTTP completions: each ends OK or refused by admission
    control with its message; none is dropped unanswered (CANCELLED)."""
    async with AsyncClient(storm_server.target) as client, \
            httpx.AsyncClient(base_url=storm_server.http_url, timeout=60,
                              limits=httpx.Limits(max_connections=400)) as http:
        await client.list_deployments()  # connected before the burst

        async def one(i: int) -> tuple[str, str]:
            try:
                chunks = [c async for c in client.generate(
                    "burst", deployment="tiny", max_tokens=2, ignore_eos=True, timeout=60)]
                assert chunks[-1].final.usage.completion_tokens == 2
                return "OK", ""
            except grpc.aio.AioRpcError as e:
                return e.code().name, e.details() or ""

        async def post(i: int) -> tuple[int, str]:
            r = await http.post("/v1/completions", json={"model": "llama-3-8b",  # tiny
                                                         "prompt": "burst", "max_tokens": 2})
            return r.status_code, r.text

        grpc_ends, http_ends = await asyncio.gather(
            asyncio.gather(*(one(i) for i in range(3000))),
            asyncio.gather(*(post(i) for i in range(400))))
        codes = Counter(code for code, _ in grpc_ends)
        assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
        assert codes["OK"] >= 5 and codes["RESOURCE_EXHAUSTED"] >= 500, codes
        assert all("waiting queue is full (max_waiting=3)" in details
                   for code, details in grpc_ends if code == "RESOURCE_EXHAUSTED")
        statuses = Counter(status for status, _ in http_ends)
        assert set(statuses) <= {200, 429} & HEALTHY_HTTP, statuses
        assert all("max_waiting" in text for status, text in http_ends if status == 429)
        await released(client, "tiny", timeout=30)
    assert not (errors := log_errors(storm_server.log)), "\n".join(errors)
