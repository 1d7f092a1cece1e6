"""SubscribeKvEvents carries what smg's relay makes of a vLLM 0.33.0 pod's events (its
`kv_relay.Normalizer`, which the servicer runs): a salted request's store names its cache salt
(read back from the first block's extra keys) and the session that stored it; a later store
continuing that chain inherits the salt from its parent; every store is local, on the device
tier, and the event ids count on across the stream."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import httpx
import pytest
from server_proc import ServerProcess
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc
from smg_grpc_proto.generated import common_pb2

EVENTS = json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://*:0",
                     "replay_endpoint": "tcp://*:0"})
POD = ("--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b", "--quant", "bf16",
       "--max-model-len", "512", "--block-size", "16", "--time-scale", "0.05",
       "--kv-events-config", EVENTS)
PROMPT = list(range(1000, 1040))  # 2 full blocks and 8 tokens


@pytest.fixture
def pod():  # one per test: the first reads the publisher's history from its start
    with ServerProcess(None, *POD) as s:
        yield s


def complete(pod, prompt: list[int], **fields) -> None:
    r = httpx.post(f"{pod.http_url}/v1/completions", timeout=30, json={
        "model": "llama-3.1-8b", "prompt": prompt, "max_tokens": 1, **fields})
    assert r.status_code == 200, r.text


async def test_the_relay_names_salt_and_session_and_children_inherit_the_salt(pod):
    complete(pod, list(range(7000, 7020)))  # batch 0 (a subscription from 0 is live only)
    complete(pod, PROMPT, cache_salt="tenant-a", session_id="conv-9")
    complete(pod, PROMPT + list(range(5000, 5040)), cache_salt="tenant-a")  # 3 more blocks
    stores: list[common_pb2.KvBlocksStored] = []
    ids: list[int] = []
    async with grpc.aio.insecure_channel(pod.target) as channel:
        call = vpb_grpc.VllmEngineStub(channel).SubscribeKvEvents(
            common_pb2.SubscribeKvEventsRequest(start_sequence_number=1))  # from the replay

        async def read() -> None:
            async for batch in call:
                ids.extend(e.event_id for e in batch.events)
                stores.extend(e.stored for e in batch.events if e.HasField("stored"))
                if len(stores) == 2:
                    return

        await asyncio.wait_for(read(), 30)  # (the replay answers at once; a bound, not a wait)
        call.cancel()
    first, child = stores
    assert (first.cache_salt, first.session_id, first.HasField("parent_block_hash")) == (
        "tenant-a", "conv-9", False)
    assert [[k.text for k in b.extra_keys] for b in first.blocks] == [["tenant-a"], []]
    assert child.parent_block_hash == first.blocks[-1].block_hash
    assert (child.cache_salt, child.HasField("session_id"), len(child.blocks)) == (
        "tenant-a", False, 3)
    for s in stores:
        assert (s.tier, s.locality, s.medium, s.group_idx) == (
            common_pb2.KV_CACHE_TIER_DEVICE, common_pb2.KV_CACHE_LOCALITY_LOCAL, "GPU", 0)
    assert ids == list(range(1, len(ids) + 1))


async def test_loads_are_smgs_bookkeeping_and_ride_the_event_stream(pod):
    """GetLoads' estimate is smg's own (`LoadTracker`) over the requests this gRPC service
    forwarded: the hit rate of their first outputs; the KV-event stream carries the same
    figures on each batch (`EngineLoad`, numbered), and sends a `load_only` batch when they
    change while no batch flows."""
    ids = list(range(9000, 9040))  # 2 full blocks and 8 tokens
    got: list[common_pb2.KvEventBatch] = []
    async with grpc.aio.insecure_channel(pod.target) as channel:
        stub = vpb_grpc.VllmEngineStub(channel)
        call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest())
        await call.initial_metadata()

        async def read() -> None:
            async for batch in call:
                got.append(batch)

        reader = asyncio.create_task(read())
        deadline = time.monotonic() + 30
        while not got:  # the relay's SUB joins asynchronously: reset until it has
            assert time.monotonic() < deadline, "no batch relayed"
            await asyncio.to_thread(httpx.post, f"{pod.http_url}/reset_prefix_cache")
            await asyncio.wait([reader], timeout=0.2)
        cached = []
        for rid in ("g-1", "g-2"):  # the second finds the first's 32 tokens cached
            request = vpb.GenerateRequest(
                request_id=rid, tokenized=vpb.TokenizedInput(input_ids=ids), stream=False,
                sampling_params=vpb.SamplingParams(max_tokens=1))
            cached += [r.complete.cached_tokens async for r in stub.Generate(request)]
        assert cached == [0, 32]
        (load,) = (await stub.GetLoads(vpb.GetLoadsRequest())).loads
        assert load.cache_hit_rate == 32 / 80  # (0 + 32) of (40 + 40) prompt tokens

        def beat() -> common_pb2.KvEventBatch | None:
            return next((b for b in got if b.load.load_only
                         and b.load.cache_hit_rate == 32 / 80), None)

        while beat() is None:  # the record moved: a load_only batch at the next tick
            assert time.monotonic() < deadline, f"no load_only batch: {got}"
            await asyncio.wait([reader], timeout=0.2)
        call.cancel()
        reader.cancel()
    last = beat()
    assert last.load.running_requests == 0 and last.load.max_running_requests > 0
    assert not last.events and last.sequence_number == max(b.sequence_number for b in got)
    assert all(b.HasField("load") for b in got)  # every batch carries the record
    assert [b.load.sample for b in got] == list(range(1, len(got) + 1))
