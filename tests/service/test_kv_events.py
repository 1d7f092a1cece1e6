"""KV-cache events from a real server, read by a subscriber written from vLLM's published
schema (pyzmq + msgspec; nothing of doppelchip's own event code), checked against
tests/fixtures/vllm_kv_hashes.json (vLLM's algorithm, computed by an independent script).

One pod with an 8-block KV pool: prompt A (3 full blocks) is stored; B (shares A's first two
blocks) stores one block parented on A's second; C (6 blocks) evicts the two LRU leaves; a
reset clears the cache. Exactly those events arrive, in gapless batches; the replay socket
returns the batches the subscriber missed; the gRPC relay (SubscribeKvEvents) carries the
same stream."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import msgspec
import pytest
import zmq
from server_proc import ServerProcess
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc
from smg_grpc_proto.generated import common_pb2


# ---- the subscriber's schema, transcribed from vLLM 0.33.0 vllm/distributed/kv_events.py ----
class Batch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class Event(msgspec.Struct, tag=True, omit_defaults=True):
    pass


class BlockStored(Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list | None = None
    group_idx: int | None = None


class BlockRemoved(Event):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(Event):
    pass


class EventBatch(Batch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODE = msgspec.msgpack.Decoder(EventBatch).decode
FIXTURE = json.loads((Path(__file__).parent.parent / "fixtures" / "vllm_kv_hashes.json")
                     .read_text())["hashes"]["sha256/vllm-none-hash"]
CASES = {c["name"]: c for c in FIXTURE}
A, B, C2 = (CASES[n] for n in ("prompt_a_3_blocks_plus_5", "prompt_b_shares_2_blocks_with_a",
                               "prompt_c_unrelated_2_blocks"))
# the fixture's hashes are of 16-token blocks: the pods pin that block size (vLLM 0.34.0's
# default on this chip is 64), and the prompts' block arithmetic below is in it
BLOCK = A["block_size"]
assert BLOCK == B["block_size"] == C2["block_size"] == 16
C = C2["token_ids"] + list(range(20032, 20096))  # 6 full blocks, the first two C2's
EVENTS_CONFIG = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                            "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0",
                            "topic": "kv"})


@pytest.fixture(scope="module")
def pod():
    doc = {"server": {"time_scale": 0.05},
           "deployments": [{"name": "kv", "model": "llama-3.1-8b", "quant": "bf16",
                            "chip": "h100-sxm", "engine": "vllm", "max_model_len": 256,
                            "block_size": BLOCK, "kv_blocks": 8,
                            "kv_events_config": EVENTS_CONFIG}]}
    with ServerProcess(doc) as s:
        yield s


class Subscriber:
    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.subscribe(b"kv")
        self.sock.connect(endpoint)
        self.batches: list[tuple[int, bytes]] = []

    def next(self, timeout_s: float = 10.0) -> tuple[int, EventBatch]:
        assert self.sock.poll(int(timeout_s * 1000)), "no KV event batch arrived"
        topic, seq, payload = self.sock.recv_multipart()
        assert topic == b"kv" and len(seq) == 8
        self.batches.append((int.from_bytes(seq, "big"), payload))
        return int.from_bytes(seq, "big"), DECODE(payload)

    def events_until(self, done, timeout_s: float = 10.0) -> list:
        got: list = []
        deadline = time.monotonic() + timeout_s
        while not done(got):
            got += self.next(deadline - time.monotonic())[1].events
        return got

    def quiet(self) -> bool:
        return not self.sock.poll(300)


def complete(pod: ServerProcess, tokens: list[int]) -> dict:
    r = httpx.post(f"{pod.http_url}/v1/completions", timeout=30,
                   json={"model": "llama-3.1-8b", "prompt": tokens, "max_tokens": 1})
    assert r.status_code == 200, r.text
    return r.json()


def stored(events: list) -> list[int]:
    return [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]


def test_events_hashes_eviction_reset_and_replay(pod: ServerProcess) -> None:
    sources = httpx.get(f"{pod.http_url}/kv_event_sources").json()
    src = sources["0"]
    assert src["endpoint"].startswith("tcp://127.0.0.1:") and src["topic"] == "kv"
    sub = Subscriber(src["endpoint"])
    # the subscription is live once a batch arrives: reset (an AllBlocksCleared batch) until
    # one does (a PUB drops what is sent before a subscriber has joined)
    while True:
        assert httpx.post(f"{pod.http_url}/reset_prefix_cache").json() == {"success": True}
        if sub.sock.poll(200):
            break
    first, batch = sub.next()
    assert [type(e) for e in batch.events] == [AllBlocksCleared]
    assert batch.data_parallel_rank == 0

    complete(pod, A["token_ids"])
    ev = sub.events_until(lambda g: stored(g))
    assert stored(ev) == A["block_hashes_int"] and all(isinstance(e, BlockStored) for e in ev)
    assert ev[0].parent_block_hash is None and ev[0].block_size == BLOCK
    assert ev[0].medium == "GPU" and ev[0].group_idx == 0 and ev[0].lora_id is None
    assert [t for e in ev for t in e.token_ids] == A["token_ids"][:3 * BLOCK]

    complete(pod, B["token_ids"])
    (ev_b,) = sub.events_until(lambda g: stored(g))
    assert ev_b.block_hashes == B["block_hashes_int"][2:]
    assert ev_b.parent_block_hash == B["block_hashes_int"][1]

    complete(pod, C)  # 6 blocks needed, 4 free: the two least recently used leaves go
    ev_c = sub.events_until(lambda g: len(stored(g)) >= 6)
    removed = [e for e in ev_c if isinstance(e, BlockRemoved)]
    assert all(len(e.block_hashes) == 1 for e in removed)
    assert [e.block_hashes[0] for e in removed] == [A["block_hashes_int"][2],
                                                    B["block_hashes_int"][2]]
    assert stored(ev_c)[:2] == C2["block_hashes_int"]
    assert ev_c.index(removed[-1]) < ev_c.index(next(e for e in ev_c
                                                     if isinstance(e, BlockStored)))

    assert httpx.post(f"{pod.http_url}/reset_prefix_cache").json() == {"success": True}
    assert [type(e) for e in sub.events_until(bool)] == [AllBlocksCleared]
    assert sub.quiet()  # nothing else

    seqs = [s for s, _ in sub.batches]
    assert seqs == list(range(first, first + len(seqs)))  # gapless

    # replay: every buffered batch from 0, the ones this subscriber missed included
    req = sub.ctx.socket(zmq.DEALER)  # a DEALER sends [b"", start] as a REQ would, and takes
    req.connect(src["replay_endpoint"])  # the many replies a REQ would drop
    req.send_multipart((b"", (0).to_bytes(8, "big")))
    replayed = []
    while True:
        assert req.poll(10_000)
        empty, topic, seq, payload = req.recv_multipart()
        assert empty == b""
        if seq == (-1).to_bytes(8, "big", signed=True):
            assert topic == b"" and payload == b""
            break
        assert topic == b"kv"
        replayed.append((int.from_bytes(seq, "big"), payload))
    assert [s for s, _ in replayed] == list(range(0, seqs[-1] + 1))
    assert replayed[first:] == sub.batches
    assert all(isinstance(e, AllBlocksCleared) for s, p in replayed[:first]
               for e in DECODE(p).events)


async def test_subscribe_kv_events_relays_the_stream(pod: ServerProcess) -> None:
    async with grpc.aio.insecure_channel(pod.target) as channel:
        stub = vpb_grpc.VllmEngineStub(channel)
        call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(
            start_sequence_number=0))
        await call.initial_metadata()
        got: list[common_pb2.KvEventBatch] = []

        async def read() -> None:
            async for batch in call:
                got.append(batch)
                if any(e.HasField("stored") for e in batch.events):
                    return

        reader = asyncio.create_task(read())
        while not reader.done():  # the relay's SUB joins asynchronously: reset until it has
            await asyncio.to_thread(httpx.post, f"{pod.http_url}/reset_prefix_cache")
            await asyncio.wait([reader], timeout=0.2)
            if any(not b.load.load_only for b in got):  # (a heartbeat says nothing of the SUB)
                break
        await asyncio.to_thread(complete, pod, C2["token_ids"] + [9] * 3)
        await asyncio.wait_for(reader, 30)
        call.cancel()
    # event batches follow each other; a `load_only` batch (smg's heartbeat, sent when the
    # engine's load moved or the stream was silent) repeats the last sequence number
    events = [b for b in got if not b.load.load_only]
    seqs = [b.sequence_number for b in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert all(not b.events for b in got if b.load.load_only)
    blocks = [blk for b in got for e in b.events if e.HasField("stored")
              for blk in e.stored.blocks]
    signed = [h - (1 << 64) if h >= 1 << 63 else h for h in C2["block_hashes_int"]]
    assert [blk.block_hash for blk in blocks] == signed
    assert [list(blk.token_ids) for blk in blocks] == [C2["token_ids"][:BLOCK],
                                                        C2["token_ids"][BLOCK:2 * BLOCK]]
    assert all(e.stored.tier == common_pb2.KV_CACHE_TIER_DEVICE for b in got for e in b.events
               if e.HasField("stored"))


async def test_subscribe_kv_events_is_unimplemented_without_events() -> None:
    doc = {"server": {"time_scale": 0.05},
           "deployments": [{"name": "plain", "model": "llama-3.1-8b", "quant": "bf16",
                            "chip": "h100-sxm", "engine": "vllm", "max_model_len": 256}]}
    with ServerProcess(doc) as s:
        async with grpc.aio.insecure_channel(s.target) as channel:
            call = vpb_grpc.VllmEngineStub(channel).SubscribeKvEvents(
                common_pb2.SubscribeKvEventsRequest())
            with pytest.raises(grpc.aio.AioRpcError) as e:
                async for _ in call:
                    pass
        assert e.value.code() is grpc.StatusCode.UNIMPLEMENTED
        assert "--kv-events-config" in e.value.details()
        assert httpx.get(f"{s.http_url}/kv_event_sources").json() == {}


@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
def test_an_xxhash_pod_names_blocks_as_vllm_with_the_same_pythonhashseed(algo: str) -> None:
    """--prefix-caching-hash-algo xxhash(_cbor): XXH3-128 block hashes, rooted in
    PYTHONHASHSEED as vLLM's (without it vLLM's root is random per process)."""
    want = {c["name"]: c for c in json.loads(
        (Path(__file__).parent.parent / "fixtures" / "vllm_kv_hashes.json").read_text()
    )["hashes"][f"{algo}/42"]}["prompt_a_3_blocks_plus_5"]["block_hashes_int"]
    doc = {"server": {"time_scale": 0.05},
           "deployments": [{"name": "kv", "model": "llama-3.1-8b", "quant": "bf16",
                            "chip": "h100-sxm", "engine": "vllm", "max_model_len": 256,
                            "block_size": BLOCK, "kv_events_config": EVENTS_CONFIG,
                            "prefix_caching_hash_algo": algo}]}
    with ServerProcess(doc, env={"PYTHONHASHSEED": "42"}) as pod:
        sub = Subscriber(httpx.get(f"{pod.http_url}/kv_event_sources").json()["0"]["endpoint"])
        while True:  # live once a reset's batch arrives (a PUB drops what comes before)
            httpx.post(f"{pod.http_url}/reset_prefix_cache")
            if sub.sock.poll(200):
                break
        complete(pod, A["token_ids"])
        assert stored(sub.events_until(lambda got: len(stored(got)) >= 3)) == want
