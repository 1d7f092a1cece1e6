"""Request-level failure injection through the real server: the error mix of 2,000+
generation requests matches the configured rate and types (a chi-square test with a
one-in-a-billion false-failure probability), every request not chosen succeeds, the k-th
request meets the fate the seed gives it, and the counters say exactly what happened; stream
cuts end gRPC streams with UNAVAILABLE after k tokens and free the request."""

from __future__ import annotations

import asyncio
import math
import tempfile
from collections import Counter
from pathlib import Path

import grpc
import pytest
from fleets import assert_released
from server_proc import ServerProcess, metric

from clients.client import AsyncClient, build_request
from server.config import parse_fleet
from server.frontend.faults import KINDS, RequestFaults
from server.frontend.stats import FrontendStats

RATE, TYPES, SEED = 35.0, ("rate_limit", "invalid_api_key", "server_error", "model_not_found"), 11
DEPLOYMENT = {"name": "flaky", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
              "engine": "vllm", "max_model_len": 256, "failure_injection_rate": RATE,
              "failure_types": list(TYPES), "failure_injection_seed": SEED}
CUT = {"name": "cut", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
       "engine": "vllm", "max_model_len": 256, "fault_stream_cut": ["after=4,percent=100"],
       "served_model_name": ["cut-model"]}
DOC = {"server": {"time_scale": 0.001, "api_server_count": 1, "default_deployment": "flaky"},
       "deployments": [DEPLOYMENT, CUT]}
SEQUENTIAL, CONCURRENT = 200, 1900


def chi2_sf_even(x: float, df: int) -> float:
    """P(X >= x) for a chi-square with an even number of degrees of freedom (closed form)."""
    k, half = df // 2, x / 2
    return math.exp(-half) * sum(half**i / math.factorial(i) for i in range(k))


def expected_fates(n: int) -> list[str | None]:
    """What the seed says about requests 0..n-1 (the server's own draw, computed here)."""
    (opts,) = parse_fleet(DOC).deployments[:1]
    path = Path(tempfile.mkdtemp()) / "f.stats"
    faults = RequestFaults(opts, 0, "llama-3.1-8b",
                           FrontendStats(path, [(0, 0)], 256, faults=True), (0, 0))
    return [faults.draw(k) for k in range(n)]


STATUS = {"RESOURCE_EXHAUSTED": "rate_limit", "UNAUTHENTICATED": "invalid_api_key",
          "UNAVAILABLE": "server_error", "NOT_FOUND": "model_not_found"}


async def one(client: AsyncClient, i: int) -> str | None:
    """The request's fate: None (it succeeded with its token) or the injected type."""
    try:
        chunks = [c async for c in client.generate([1 + i % 500, 7, 9], deployment="flaky",
                                                   max_tokens=1, ignore_eos=True)]
    except grpc.aio.AioRpcError as e:
        fate = STATUS[e.code().name]
        assert e.details() == KINDS[fate].message.format(model="llama-3.1-8b")
        return fate
    assert chunks[-1].final.usage.completion_tokens == 1  # not chosen: it succeeds
    return None


@pytest.fixture(scope="module")
def server():
    with ServerProcess(DOC) as s:
        yield s


async def test_error_mix_matches_the_rates_and_the_seed(server):
    async with AsyncClient(server.target) as client:
        # sequentially: the k-th request to arrive meets the k-th fate of the seed
        seq = [await one(client, i) for i in range(SEQUENTIAL)]
        assert seq == expected_fates(SEQUENTIAL)
        sem = asyncio.Semaphore(24)

        async def limited(i: int) -> str | None:
            async with sem:
                return await one(client, i)

        rest = await asyncio.gather(*(limited(i) for i in range(CONCURRENT)))
        await assert_released(client, "flaky")
    text = await asyncio.to_thread(server.scrape)
    fates = Counter(seq + list(rest))
    n = SEQUENTIAL + CONCURRENT
    assert sum(fates.values()) == n >= 2000
    p_fail = RATE / 100
    expected = {None: n * (1 - p_fail), **{t: n * p_fail / len(TYPES) for t in TYPES}}
    chi2 = sum((fates[k] - e) ** 2 / e for k, e in expected.items())
    p_value = chi2_sf_even(chi2, df=len(expected) - 1)  # 5 categories - 1 = 4 dof
    assert p_value > 1e-9, (fates, chi2)
    assert set(fates) <= set(expected)
    for t in KINDS:  # the counters say exactly what the clients saw
        assert metric(text, "doppelchip_failure_injections_total", deployment="flaky",
                      failure_type=t) == fates.get(t, 0)
    assert metric(text, "vllm:request_success_total", deployment="flaky",
                  finished_reason="length") == fates[None]


async def test_stream_cut_ends_the_grpc_stream_after_k_tokens_and_frees_it(server):
    async with AsyncClient(server.target) as client:
        call = client.stub.Generate(build_request([5, 6, 7], deployment="cut",
                                                  max_tokens=50, ignore_eos=True))
        received = []
        try:
            async for chunk in call:
                received.extend(chunk.token_ids)
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE
            # at the first chunk boundary at or after 4 tokens (a lagging host may pile
            # several tokens into one chunk)
            assert f"cut by fault injection after {len(received)} tokens" in e.details()
        else:
            raise AssertionError("the stream was not cut")
        assert 4 <= len(received) < 50
        await assert_released(client, "cut")
    text = await asyncio.to_thread(server.scrape)
    assert metric(text, "doppelchip_stream_cuts_total", deployment="cut") == 1
    assert metric(text, "vllm:request_success_total", deployment="cut",
                  finished_reason="abort") == 1


async def test_stream_cut_closes_the_http_stream_without_done(server):
    import httpx

    lines: list[str] = []
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        try:
            async with http.stream("POST", "/v1/completions", json={
                    "model": "cut-model", "prompt": "hi", "max_tokens": 50,
                    "ignore_eos": True, "stream": True}) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line:
                        lines.append(line)
        except httpx.RemoteProtocolError as e:
            assert "incomplete" in str(e) or "closed" in str(e)
        else:
            raise AssertionError("the connection was not cut")
    assert lines and "data: [DONE]" not in lines
    assert not any('"finish_reason":"length"' in line for line in lines)  # cut before its end
    async with AsyncClient(server.target) as client:
        await assert_released(client, "cut")
