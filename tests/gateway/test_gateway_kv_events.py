"""Cache-aware routing in the real smg fed by SubscribeKvEvents (docs/KV_EVENTS.md).

Two replicas with small KV pools behind smg. Phase 1 sends K shared-prefix prompts through
smg (each lands on some replica, which caches the prefix). Phase 2 goes around smg, straight
to the replicas, as other traffic would: an unrelated flood evicts every cached prefix on
both, and each prefix is then recomputed on the replica that phase 1 did *not* use. Only the
KV events (BlockRemoved, BlockStored) tell smg. Phase 3 sends each prefix again, with a new
suffix, through smg, and measures the prefix-cache hit rate of those requests from their
usage: cache-aware with events routes to the holder; cache-aware without events (the
replicas publish nothing, SubscribeKvEvents is UNIMPLEMENTED, smg falls back to its own
approximate tree) routes to where phase 1 went, now empty; round robin rotates regardless of
the caches (with K even its phase-3 rotation repeats phase 1's: the emptied replica every
time). The replicas with events serve both the cache-aware and the round-robin run (their
caches reset in between); smg is a fresh process per run. Measured numbers:
docs/KV_EVENTS.md."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from pathlib import Path

import httpx
import pytest
import zmq
from gateway_harness import SMG, Gateway, free_port, start_smg, stop_group, wait_for
from server_proc import ServerProcess

from server.engine.tokenizer import get_tokenizer

pytestmark = pytest.mark.skipif(SMG is None, reason="smg is not installed (make install-dev)")

TOK = get_tokenizer()
K = 4  # shared prefixes
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
         "sierra", "tango", "uniform", "victor", "whiskey", "xray"]
EVENTS = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                     "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0"})
SMG_CACHE_AWARE = ("--worker-warmup-secs", "0", "--worker-warmup-divert-every", "0")


def fleet(events: bool) -> dict:
    # 16-token blocks pinned (vLLM 0.34.0's default on this chip is 64): the 48-block pools,
    # the 10-12-block prefixes and the 15-block floods that evict them are counted in them
    dep = {"name": "kv", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
           "engine": "vllm", "max_model_len": 1024, "block_size": 16, "kv_blocks": 48}
    if events:
        dep["kv_events_config"] = EVENTS
    return {"server": {"time_scale": 0.05, "vllm_engine_deployment": "kv",
                       "default_deployment": "kv"}, "deployments": [dep]}


def prefix(i: int) -> str:
    """171-195 tokens shared by the requests of group i (10-12 full blocks)."""
    return f"Group {i} system prompt: " + " ".join(
        WORDS[(i * 7 + j * 3) % len(WORDS)] + str(j % 10) for j in range(60)) + "."


def successes(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$",
                                            text, re.M))


def direct(url: str, text: str, max_prompt: int = 1000) -> None:
    r = httpx.post(f"{url}/v1/completions", timeout=30, json={
        "model": "llama-3.1-8b", "prompt": TOK.encode(text)[:max_prompt], "max_tokens": 1})
    assert r.status_code == 200, r.text


async def through(gw: Gateway, text: str) -> tuple[int, int]:
    status, body = await gw.call("POST", "/v1/completions", {
        "model": gw.model, "prompt": text, "max_tokens": 1}, timeout=30)
    assert status == 200, body
    usage = body["usage"]
    return usage["prompt_tokens"], (usage.get("prompt_tokens_details") or {}).get(
        "cached_tokens", 0)


@contextlib.asynccontextmanager
async def replicas(events: bool):
    servers = [ServerProcess(fleet(events)) for _ in range(2)]
    try:
        for r in servers:
            await asyncio.to_thread(r.start)
        yield servers
    finally:
        for r in servers:
            await asyncio.to_thread(r.stop)


async def scenario(tmp_path: Path, servers: list[ServerProcess], policy: str) -> float:
    """Phases 1-3 through a fresh smg; the hit rate of phase 3."""
    tmp_path.mkdir()
    urls = [r.http_url for r in servers]
    for u in urls:  # a clean start: nothing cached anywhere
        assert httpx.post(f"{u}/reset_prefix_cache").json() == {"success": True}
    events = "endpoint" in httpx.get(f"{urls[0]}/kv_event_sources").json().get("0", {})
    metrics_port = free_port()
    proc, port = start_smg([f"grpc://{r.target}" for r in servers], tmp_path / "smg.log",
                           "--policy", policy, *SMG_CACHE_AWARE,
                           "--prometheus-port", str(metrics_port))
    gw = Gateway(servers, port, proc, tmp_path / "smg.log")
    try:
        await gw.wait_ready(2)
        if events and policy == "cache_aware":  # subscribed before the traffic starts
            await wait_for(lambda: gw.log_tail(10**7).count("KV event stream connected") >= 2,
                           30)
            before_phase1 = 0  # batches published before smg subscribed: not for smg
            for u in urls:
                before_phase1 += await asyncio.to_thread(batches_published, u)
        first = []
        for i in range(K):  # phase 1, through smg: where does each prefix go?
            before = [successes(u) for u in urls]
            await through(gw, prefix(i) + " Question 0?")
            after = [successes(u) for u in urls]
            first.append(next(r for r in range(2) if after[r] > before[r]))
        for u in urls:  # phase 2, around smg: evict everything on both replicas ...
            for j in range(3):
                flood = " ".join(f"flood{j}x{n}" for n in range(200))
                await asyncio.to_thread(direct, u, flood, 250)  # 15 blocks each
        for i in range(K):  # ... then each prefix on the replica phase 1 did not use
            await asyncio.to_thread(direct, urls[1 - first[i]], prefix(i) + " Warm?")
        if events and policy == "cache_aware":  # smg has applied every batch since phase 1
            published = 0
            for u in urls:
                published += await asyncio.to_thread(batches_published, u)
            await wait_for(lambda: smg_batches(metrics_port) >= published - before_phase1, 30)
        prompt = cached = 0
        for i in range(K):  # phase 3, through smg
            p, c = await through(gw, prefix(i) + " Question 1?")
            prompt, cached = prompt + p, cached + c
        return cached / prompt
    finally:
        await asyncio.to_thread(stop_group, proc)


def batches_published(url: str) -> int:
    """How many batches the replica's publisher has sent: its replay buffer, from 0."""
    replay = httpx.get(f"{url}/kv_event_sources").json()["0"]["replay_endpoint"]
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(replay)
    sock.send_multipart((b"", (0).to_bytes(8, "big")))
    n = 0
    try:
        while True:
            assert sock.poll(10_000), "no replay answer"
            if sock.recv_multipart()[2] == (-1).to_bytes(8, "big", signed=True):
                return n
            n += 1
    finally:
        sock.close(linger=0)


def smg_batches(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(r"^smg_kv_event_batches_total(?:\{[^}]*\})? (\S+)$",
                                            text, re.M))


@pytest.mark.slow  # two pairs of replicas and three smg processes: ~100 s on 2 cores
async def test_cache_aware_routing_follows_the_kv_events(tmp_path, capsys):
    async with replicas(events=True) as servers:
        with_events = await scenario(tmp_path / "a", servers, "cache_aware")
        round_robin = await scenario(tmp_path / "c", servers, "round_robin")
    async with replicas(events=False) as servers:
        without = await scenario(tmp_path / "b", servers, "cache_aware")
    with capsys.disabled():
        print(f"\nprefix-cache hit rate of phase 3: cache_aware + events {with_events:.3f}, "
              f"cache_aware without events {without:.3f}, round_robin {round_robin:.3f}")
    assert with_events > round_robin + 0.2
    assert with_events > without + 0.2
