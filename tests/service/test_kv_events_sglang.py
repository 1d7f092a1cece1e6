"""KV events of a pod that imitates SGLang (`--http-api sglang`), read as SGLang's consumers
read them (llm-d's KV-cache indexer's SGLang adapter, smg): SGLang's positional wire form
(`sglang/srt/disaggregation/kv_events.py`: a batch `[ts, events, attn_dp_rank]`, each event a
tagged array with every field), one `BlockStored` per page chained to the page before it, one
`BlockRemoved` per evicted page, `AllBlocksCleared` on `/flush_cache`; page hashes SGLang's
(`get_hash_str` + `hash_str_to_int64`, recomputed here with hashlib from SGLang's description,
nothing of doppelchip's); replay answers `[seq, payload]` without the topic frame; the gRPC
relay (`SglangScheduler.SubscribeKvEvents`) carries the same hashes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re

import grpc
import httpx
import msgspec
import pytest
from kv_replay import replayed
from server_proc import ServerProcess
from smg_grpc_proto import sglang_scheduler_pb2_grpc as spb_grpc
from smg_grpc_proto.generated import common_pb2

PAGE = 4
EVENTS = json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://*:0",
                     "replay_endpoint": "tcp://*:0", "topic": "kv"})
POD = ("--chip", "h100-sxm", "--engine", "sglang", "--model", "llama-3.1-8b", "--quant",
       "bf16", "--max-model-len", "128", "--block-size", str(PAGE), "--num-gpu-blocks-override",
       "12", "--time-scale", "0.05", "--http-api", "sglang", "--kv-events-config", EVENTS)


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *POD) as s:
        yield s


def sglang_hashes(tokens: list[int], prior: bytes | None = None) -> list[int]:
    """SGLang's page hashes: SHA-256 over the previous page's digest and each token as 4
    little-endian bytes; on the wire the digest's first 16 hex digits as a signed int64."""
    out = []
    for i in range(0, len(tokens) - PAGE + 1, PAGE):
        h = hashlib.sha256()
        if prior is not None:
            h.update(prior)
        for t in tokens[i:i + PAGE]:
            h.update(t.to_bytes(4, "little"))
        prior = h.digest()
        v = int(h.hexdigest()[:16], 16)
        out.append(v - 2**64 if v >= 2**63 else v)
    return out


def replay(endpoint: str, start: int) -> list[tuple[int, list]]:
    """SGLang's replay protocol (a DEALER sends what a REQ would, `[b"", start]`): every
    buffered batch from `start`, each answer `[b"", seq, payload]` (no topic frame), decoded
    without a schema: the positional arrays as they are on the wire."""
    return [(seq, msgspec.msgpack.decode(payload))
            for seq, payload in replayed(endpoint, start, frames=3)]


def complete(pod: ServerProcess, tokens: list[int]) -> None:
    r = httpx.post(f"{pod.http_url}/v1/completions", timeout=30,
                   json={"model": "x", "prompt": tokens, "max_tokens": 1})
    assert r.status_code == 200, r.text


def endpoints(pod: ServerProcess) -> tuple[str, str]:
    line = pod.wait_for_log(r"KV events: publishing on \S+ \(bound\), replay on \S+")
    m = re.search(r"publishing on (\S+) \(bound\), replay on (\S+)", line)
    assert m is not None
    return m.group(1), m.group(2)


def test_sglangs_wire_form_hashes_and_replay(pod):
    publish_at, replay_at = endpoints(pod)
    server_info = httpx.get(f"{pod.http_url}/server_info", timeout=30).json()
    assert json.loads(server_info["kv_events_config"]) == {  # where a router subscribes
        "publisher": "zmq", "endpoint": publish_at, "replay_endpoint": replay_at, "topic": "kv"}
    host, port = publish_at.removeprefix("tcp://").rsplit(":", 1)
    assert server_info["kv_events"] == {  # newer SGLang's block, which gateways discover
        "publisher": "zmq", "endpoint_host": host, "endpoint_port_base": int(port),
        "topic": "kv", "block_size": PAGE, "dp_size": 1}
    a = list(range(1000, 1010))  # 10 tokens: two full pages
    complete(pod, a)
    b = [*a[:8], *range(2000, 2008)]  # shares a's two pages, adds two
    complete(pod, b)
    batches = replay(replay_at, 0)
    assert [s for s, _ in batches] == list(range(len(batches)))
    for ts, _events, rank in (b for _, b in batches):
        assert isinstance(ts, float) and rank == 0
    events = [e for _, (_, evs, _) in batches for e in evs]
    stored = [e for e in events if e[0] == "BlockStored"]
    assert all(len(e) == 7 and len(e[1]) == 1 and e[5] is None and e[6] == "GPU"
               and e[4] == PAGE == len(e[3]) for e in stored)  # one page per event
    ha, hb = sglang_hashes(a), sglang_hashes(b)
    assert [e[1][0] for e in stored] == ha + hb[2:]
    assert [e[2] for e in stored] == [None, ha[0], ha[1], hb[2]]  # each page's parent
    assert [e[3] for e in stored] == [a[0:4], a[4:8], b[8:12], b[12:16]]

    # 12 pages: a long unrelated prompt evicts the least recently used pages, one event each
    c = list(range(5000, 5033))  # 8 full pages
    complete(pod, c)
    later = [e for _, (_, evs, _) in replay(replay_at, len(batches)) for e in evs]
    removed = [e for e in later if e[0] == "BlockRemoved"]
    assert removed and all(len(e) == 3 and len(e[1]) == 1 and e[2] == "GPU" for e in removed)
    assert {e[1][0] for e in removed} <= set(ha + hb)
    assert [e[1][0] for e in later if e[0] == "BlockStored"] == sglang_hashes(c)

    r = httpx.post(f"{pod.http_url}/flush_cache", timeout=30)
    assert r.status_code == 200
    last = replay(replay_at, len(batches))[-1][1]
    assert last[1] == [["AllBlocksCleared"]]


async def test_the_grpc_relay_carries_sglangs_hashes(pod):
    _, replay_at = endpoints(pod)
    d = list(range(7000, 7009))
    await asyncio.to_thread(complete, pod, d)
    first = (await asyncio.to_thread(replay, replay_at, 0))[-1][0]  # d's batch or after it
    async with grpc.aio.insecure_channel(pod.target) as channel:
        call = spb_grpc.SglangSchedulerStub(channel).SubscribeKvEvents(
            common_pb2.SubscribeKvEventsRequest(start_sequence_number=1))
        hashes: list[int] = []
        loads: list[common_pb2.EngineLoad] = []
        async for batch in call:
            hashes += [blk.block_hash for e in batch.events if e.HasField("stored")
                       for blk in e.stored.blocks]
            loads.append(batch.load)
            if batch.sequence_number >= first:
                break
        call.cancel()
    assert sglang_hashes(d)[0] in hashes and sglang_hashes(d)[1] in hashes
    # each batch carries the rank's load as smg's SGLang servicer stamps it (the LoadSnapshot
    # GetLoads reports: the page pool's tokens, SGLang's max_running_requests)
    assert [x.sample for x in loads] == list(range(1, len(loads) + 1))
    assert loads[0].max_total_num_tokens == 12 * PAGE and loads[0].max_running_requests > 0
