"""`SubscribeKvEvents` on a pod with two data-parallel ranks: each rank publishes its own stream
(its own port and sequence), and the relay carries both in one gRPC stream, each batch under
its rank's sequence number with its `dp_rank` — the group's rank, which a pod running ranks 2
and 3 of a group of 4 (`--data-parallel-start-rank 2`) names so — as smg-grpc-servicer
0.14.1's relay does; the blocks a request stored arrive from the rank that ran it."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import httpx
import pytest
from server_proc import ServerProcess
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc
from smg_grpc_proto.generated import common_pb2

EVENTS = json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://*:0",
                     "replay_endpoint": "tcp://*:0"})
# 16-token blocks pinned (vLLM 0.34.0's default on this chip is 64): a 40-token prompt fills
# two blocks, whose BlockStored events are what the test waits for from each rank
POD = ("--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b", "--quant", "bf16",
       "--max-model-len", "256", "--block-size", "16", "--data-parallel-size", "2",
       "--time-scale", "0.05", "--kv-events-config", EVENTS)


def complete(pod: ServerProcess, rank: int, seed: int) -> None:
    r = httpx.post(f"{pod.http_url}/v1/completions", timeout=30,
                   headers={"X-data-parallel-rank": str(rank)},
                   json={"model": "llama-3.1-8b", "max_tokens": 1,
                         "prompt": [seed * 100 + i for i in range(40)]})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("start", [0, 2])
async def test_every_ranks_stream_is_relayed_under_its_own_sequence(start):
    group = ("--data-parallel-size", "4", "--data-parallel-size-local", "2",
             "--data-parallel-start-rank", "2") if start else ()
    with ServerProcess(None, *POD, *group) as pod:
        async with grpc.aio.insecure_channel(pod.target) as channel:
            call = vpb_grpc.VllmEngineStub(channel).SubscribeKvEvents(
                common_pb2.SubscribeKvEventsRequest())
            await call.initial_metadata()
            got: dict[int, list[common_pb2.KvEventBatch]] = {start: [], start + 1: []}

            async def read() -> None:
                async for batch in call:
                    got[batch.dp_rank].append(batch)
                    if all(any(e.HasField("stored") for b in bs for e in b.events)
                           for bs in got.values()):
                        return

            reader = asyncio.create_task(read())
            deadline, seed = time.monotonic() + 30, 0
            while not reader.done():  # the relay's SUBs join asynchronously: send until heard
                assert time.monotonic() < deadline, f"not both ranks: {got}"
                seed += 1
                for rank in (0, 1):  # the header pins by the pod's local engine index
                    await asyncio.to_thread(complete, pod, rank, seed * 2 + rank)
                await asyncio.wait([reader], timeout=0.2)
            call.cancel()
    for rank, batches in got.items():
        # each rank's own counter, in order (a load_only heartbeat repeats its rank's last)
        seqs = [b.sequence_number for b in batches if not b.load.load_only]
        assert seqs == sorted(set(seqs)), seqs
        tokens = {t // 100 % 2 for b in batches for e in b.events if e.HasField("stored")
                  for blk in e.stored.blocks for t in blk.token_ids}
        assert tokens == {rank - start}  # the blocks of the requests pinned to that rank
