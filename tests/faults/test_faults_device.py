"""Device faults through the real server, each with its signature in the metrics and in a
client's emulated timings, and nothing left behind (KV pool and queues back to idle, engines
run with --check-integrity):
- slowdown ×4: the step-time histogram's mean and a client's inter-token latency are 4× a
  twin deployment's;
- hang: a stream stalls mid-response for the hang, health stays SERVING, the stall is counted;
- crash: the in-flight stream ends UNAVAILABLE, the engine comes back after the back-off and
  its cold start, requests succeed again;
- lost chips: the pool loses half its blocks while loaded, preemptions follow, every block
  comes back.
Times are emulated seconds since the server started (time_scale 0.05: 20 per wall second);
the hang starts at t=240, the crash at 300, the lost chips at 390, after every engine is ready
(read from the engine's log; a host too slow to start them by then skips the module rather
than testing nothing), each after the previous test is done with its own.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re

import grpc
import pytest
from fleets import assert_released
from server_proc import ServerProcess, metric, until

from clients.client import AsyncClient
from doppelchip.v1 import inference_pb2 as pb

AT = float(os.environ.get("DOPPELCHIP_TEST_FAULT_AT", "240"))  # 12 s of wall time
CRASH_AT, LOSS_AT = AT + 60, AT + 150  # one after the other: the tests run in this order
H100 = {"model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm", "engine": "vllm",
        "max_model_len": 256}
SLOW = {"model": "llama-3.1-70b", "quant": "q4_k_m", "chip": "rtx-4090", "engine": "llama.cpp",
        "max_num_seqs": 1}  # ~0.3 s per token
DOC = {
    "server": {"time_scale": 0.05, "engine_restart_backoff_s": 0.2, "api_server_count": 1},
    "deployments": [
        {"name": "steady", **H100},
        {"name": "slowed", **H100, "fault_slowdown": ["at=0,for=1e9,factor=4"]},
        {"name": "wedged", **SLOW, "fault_hang": [f"at={AT},for=20"]},
        {"name": "crashy", **SLOW, "max_num_seqs": 2, "fault_crash": [f"at={CRASH_AT}"]},
        # 16-token blocks (vLLM 0.34.0's default is 64): its test's three streams, 16 blocks
        # each, fill the 48
        {"name": "lossy", "model": "llama-3.1-8b", "quant": "bf16", "chip": "rtx-4090",
         "engine": "vllm", "tp": 2, "kv_blocks": 48, "block_size": 16, "max_model_len": 512,
         "fault_lost_chips": [f"at={LOSS_AT},chips=1,for=30"]},
    ],
}


@pytest.fixture(scope="module")
def server():
    with ServerProcess(DOC) as s:
        for name in ("slowed", "wedged", "crashy", "lossy"):
            line = s.wait_for_log(rf"fault injection: {name} armed at t=")
            armed = float(re.search(r"armed at t=([\d.]+)", line).group(1))
            if armed >= AT - 20:
                pytest.skip(f"host too slow: {name} was ready only at t={armed} (emulated)")
        yield s


async def not_yet(server, deployment: str, fault: str) -> None:
    """The test must start before its fault (else it would wait for nothing)."""
    text = await asyncio.to_thread(server.scrape)
    assert metric(text, "doppelchip_fault_events_total", deployment=deployment,
                  fault=fault) == 0, f"{fault} of {deployment} happened before its test began"


def gaps(times) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


async def stream(client, deployment: str, n: int, prompt=(3, 4, 5), on_token=None):
    """(token times, final chunk or None, the error if it failed); `on_token()` is called
    after each chunk with tokens."""
    times, final = [], None
    try:
        async for c in client.generate(list(prompt), deployment=deployment, max_tokens=n,
                                       ignore_eos=True, return_token_times=True):
            times.extend(c.token_times)
            if on_token is not None and c.token_times:
                on_token()
            if c.HasField("final"):
                final = c.final
    except grpc.aio.AioRpcError as e:
        return times, final, e
    return times, final, None


async def test_slowdown_multiplies_step_time_and_inter_token_latency(server):
    async with AsyncClient(server.target) as client:
        steady, _, _ = await stream(client, "steady", 40)
        slowed, _, _ = await stream(client, "slowed", 40)
        ratio = sum(gaps(slowed)) / sum(gaps(steady))
        assert ratio == pytest.approx(4.0, rel=1e-6)
        await assert_released(client, "slowed")
    text = await asyncio.to_thread(server.scrape)

    def mean_step(d: str) -> float:
        return (metric(text, "doppelchip_step_seconds_sum", deployment=d)
                / metric(text, "doppelchip_step_seconds_count", deployment=d))
    assert mean_step("slowed") == pytest.approx(4 * mean_step("steady"), rel=1e-6)
    assert metric(text, "doppelchip_slowdown_factor", deployment="slowed") == 4
    assert 'doppelchip_slowdown_factor{deployment="steady"}' not in text  # no faults: no series
    assert metric(text, "doppelchip_fault_active", deployment="slowed", fault="slowdown") == 1


async def test_hang_stalls_streams_while_health_stays_serving(server):
    await not_yet(server, "wedged", "hang")
    async with AsyncClient(server.target) as client:
        for _ in range(100):  # streams back to back until one lived through the hang
            times, final, err = await stream(client, "wedged", 60)
            assert err is None and final is not None
            waits = gaps([0.0, *times])  # from arrival: a held first step shows too
            if max(waits) > 10:
                break
        else:
            raise AssertionError("no stream stalled")
        d = await client.get_deployment("wedged")
        assert d.state == pb.DEPLOYMENT_STATE_READY  # a wedged GPU looks healthy
        assert await client.health() == 1  # SERVING
        await assert_released(client, "wedged")
    text = await asyncio.to_thread(server.scrape)
    stalled = metric(text, "doppelchip_hang_seconds_total", deployment="wedged")
    assert 18 <= stalled <= 20  # held from the first step boundary inside the window
    assert stalled <= max(waits) <= stalled + 1.0  # plus the step that then ran
    assert metric(text, "doppelchip_fault_events_total", deployment="wedged", fault="hang") == 1
    assert metric(text, "doppelchip_fault_active", deployment="wedged", fault="hang") == 0


async def test_crash_fails_in_flight_streams_and_the_engine_comes_back(server):
    await not_yet(server, "crashy", "crash")
    crashed, first_token = asyncio.Event(), asyncio.Event()
    async with AsyncClient(server.target) as client:
        async def worker(n: int, after_first_token: bool):
            """Streams of n tokens back to back until one fails. The two workers' streams
            (60 and 97 tokens, two seats, the second worker starting after the first's first
            token) all but never start in the same step, so whichever step the crash ends,
            one of them is mid-stream (one queue of streams missed that when the crash fell
            between two of them)."""
            if after_first_token:
                await first_token.wait()
            for _ in range(100):
                times, _, err = await stream(client, "crashy", n, on_token=first_token.set)
                if err is not None:
                    crashed.set()
                    return times, err
                if crashed.is_set():
                    return None
            raise AssertionError("no stream failed")

        results = await asyncio.gather(worker(60, False), worker(97, True))
        failed = [r for r in results if r is not None]
        for times, err in failed:
            assert err.code() == grpc.StatusCode.UNAVAILABLE
            if times:  # mid-stream: ended with the supervisor's word on how the engine died
                assert "engine process exited (exit status 70)" in err.details()
            else:  # submitted as it died: the same word, or refused at the dead engine's
                # socket before the supervisor's word arrived (CI saw that once)
                assert ("engine process exited (exit status 70)" in err.details()
                        or "its engine process is not reachable" in err.details())
        assert any(times for times, _ in failed)  # one was mid-stream
        await until(client, "crashy", lambda d: d.state == pb.DEPLOYMENT_STATE_READY,
                    timeout=60)
        _, final, err = await stream(client, "crashy", 5)
        assert err is None and final.usage.completion_tokens == 5
        await assert_released(client, "crashy")
    text = await asyncio.to_thread(server.scrape)
    assert metric(text, "doppelchip_fault_events_total", deployment="crashy", fault="crash") == 1
    # every request the engine held ends as an error; a worker's next stream, submitted once
    # the front end saw the crash (or still awaiting its admission then), is refused
    # (UNAVAILABLE, "deployment 'crashy' is failed: ...") without ever being a request there,
    # so the count lies between the streams failed mid-stream and all failed streams
    errors = metric(text, "vllm:request_success_total", deployment="crashy",
                    finished_reason="error")
    assert sum(1 for times, _ in failed if times) <= errors <= len(failed)
    assert metric(text, "doppelchip_compile_events_total", deployment="crashy",
                  reason="cold_start") == 1  # the restart paid its cold start
    assert "fault injection: crashy crashes" in server.log


async def test_lost_chips_shrink_the_pool_preemptions_follow_and_blocks_return(server):
    await not_yet(server, "lossy", "lost_chips")
    done = asyncio.Event()
    async with AsyncClient(server.target) as client:
        async def worker(j: int) -> int:
            n = 0
            while not done.is_set():  # back to back: the pool is busy when the chips go
                # 100 + 150 tokens: admitted with 7 blocks, grown to 16; three fill the 48
                # blocks exactly, so only the lost half makes them preempt each other
                prompt = [(1000 * n + 300 * j + k) % 30000 + 1 for k in range(100)]
                _, final, err = await stream(client, "lossy", 150, prompt=prompt)
                assert err is None and final.usage.completion_tokens == 150
                n += 1
            return n

        workers = [asyncio.create_task(worker(j)) for j in range(3)]
        seen_loss, deadline = False, asyncio.get_running_loop().time() + 120
        while asyncio.get_running_loop().time() < deadline:
            text = await asyncio.to_thread(server.scrape)
            active = metric(text, "doppelchip_fault_active", deployment="lossy",
                            fault="lost_chips")
            seen_loss |= active == 1
            if metric(text, "doppelchip_fault_events_total", deployment="lossy",
                      fault="lost_chips") == 1 and active == 0:
                break
            await asyncio.sleep(0.05)
        done.set()
        counts = await asyncio.gather(*workers)
        assert seen_loss and min(counts) > 0
        await assert_released(client, "lossy")
        d = await client.get_deployment("lossy")
        assert d.capacity.kv_blocks_free == d.capacity.kv_blocks_total == 48
    text = await asyncio.to_thread(server.scrape)
    assert metric(text, "vllm:num_preemptions_total", deployment="lossy") >= 1
    assert metric(text, "doppelchip_kv_lost_blocks", deployment="lossy") == 0
    assert metric(text, "vllm:num_preemptions_total", deployment="steady") == 0
    assert "fault injection: lossy lost_chips ended" in server.log
