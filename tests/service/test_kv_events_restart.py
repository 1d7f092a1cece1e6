"""KV events across an engine restart. A TensorRT-LLM pod publishes on ports the OS chose
(`tcp://*:0`, as `doppelchip trtllm-serve` configures them); its engine is killed and comes
back. The new engine binds the same endpoints (the front end and any subscriber keep the
address), its publisher counts from 0 again, and each reader notices: `POST /kv_cache_events`
starts over from a `created` event, as a restarted trtllm-serve's buffer does, and goes on
converting; a live `SubscribeKvEvents` stream ends with DATA_LOSS (smg's servicer's answer to
a restarted publisher) and a new one receives the new engine's batches."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import grpc
import httpx
import pytest
from server_proc import ServerProcess
from smg_grpc_proto import trtllm_service_pb2_grpc as tpb_grpc
from smg_grpc_proto.generated import common_pb2

EVENTS = ('{"enable_kv_cache_events": true, "endpoint": "tcp://*:0", '
          '"replay_endpoint": "tcp://*:0"}')
# the engine is vLLM's behind trtllm-serve's HTTP server: a restart pays the cold start, and
# vLLM's emulated compile is seconds where TensorRT-LLM's engine build is minutes
POD = ("--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b", "--quant",
       "fp8", "--max-model-len", "512", "--block-size", "16", "--time-scale", "0.05",
       "--http-api", "trtllm", "--kv-events-config", EVENTS, "--engine-restart-backoff", "0.2")
UP = r"engine core of (\S+) \(rank 0\) up: pid (\d+)"


def complete(http: httpx.Client, seed: int) -> None:
    ids = [100 + seed * 1000 + i for i in range(48)]
    r = http.post("/v1/completions", json={"model": "x", "prompt": ids, "max_tokens": 1})
    assert r.status_code == 200, r.text


def stored_keys(events: list[dict]) -> list[int]:
    return [b["block_hash"] for e in events if e["data"]["type"] == "stored"
            for b in e["data"]["blocks"]]


def healthy_again(server: ServerProcess, http: httpx.Client, killed: int) -> None:
    """The new engine said it is up, and the pod answers /health 200 again."""
    start = len(server.lines)
    os.kill(killed, signal.SIGKILL)
    m = re.search(UP, server.wait_for_log(UP, start=start, timeout=60))
    assert m is not None and int(m.group(2)) != killed
    deadline = time.monotonic() + 60
    while http.get("/health").status_code != 200:
        assert time.monotonic() < deadline, "the pod did not come back"
        time.sleep(0.05)


async def next_batch(call) -> common_pb2.KvEventBatch:
    return await asyncio.wait_for(call.read(), 30)


async def subscribe(stub, http: httpx.Client) -> tuple[object, common_pb2.KvEventBatch]:
    """Two requests, then a subscription from sequence 1, which the replay socket serves at
    once: a stream that is surely established (a live-only one could miss what is published
    before its SUB socket has joined)."""
    for seed in (1, 3):
        await asyncio.to_thread(complete, http, seed)
    call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(start_sequence_number=1))
    await call.initial_metadata()
    return call, await next_batch(call)


async def test_readers_start_over_with_the_restarted_engine():
    with ServerProcess(None, *POD) as server, httpx.Client(base_url=server.http_url,
                                                           timeout=30) as http:
        engine = int(re.search(UP, server.wait_for_log(UP)).group(2))
        async with grpc.aio.insecure_channel(server.target) as channel:
            stub = tpb_grpc.TrtllmServiceStub(channel)
            live, first = await subscribe(stub, http)
            assert first.sequence_number == 1 and first.events
            before = http.post("/kv_cache_events").json()
            assert [e["event_id"] for e in before][:1] == [0] and stored_keys(before)

            await asyncio.to_thread(healthy_again, server, http, engine)
            again, batch = await subscribe(stub, http)  # the same prompts, an empty cache
            assert batch.sequence_number == 1 and batch.events  # the new engine's stream
            after = http.post("/kv_cache_events").json()
            assert after[0]["event_id"] == 0 and after[0]["data"]["type"] == "created"
            assert stored_keys(after) == stored_keys(before)  # the same blocks, stored anew
            with pytest.raises(grpc.aio.AioRpcError) as err:
                while True:
                    await next_batch(live)
            assert err.value.code() == grpc.StatusCode.DATA_LOSS
            assert "KV event publisher restarted" in (err.value.details() or "")
            again.cancel()
