"""A TensorRT-LLM pod's KV cache events (`POST /kv_cache_events`) and `/server_info`, read the
way TensorRT-LLM's `KvCacheAwareRouter` reads them: it takes `tokens_per_block` and
`kv_cache_hash_algo` from `/server_info`, keys a prompt's blocks itself (all but the prompt's
last token, a short last block included), keeps per worker the set of `block_hash`es that
`stored` events added and `removed` events took away, and counts the leading blocks of a
prompt found in that set. Here that count must be what the pod's prefix cache really holds
(its `cached_tokens`), before and after evictions; the drained buffer starts with `created`
and holds each event once."""

from __future__ import annotations

import pytest
from http_helpers import http_client, pod_released
from server_proc import ServerProcess

from server.kv_events.trtllm_hash import block_key

BLOCK = 16
EVENTS = ('{"enable_kv_cache_events": true, "endpoint": "tcp://*:0", '
          '"replay_endpoint": "tcp://*:0"}')
POD = ("--chip", "h100-sxm", "--engine", "tensorrt-llm", "--model", "llama-3.1-8b", "--quant",
       "fp8", "--max-model-len", "512", "--block-size", str(BLOCK), "--time-scale", "0.05",
       "--num-gpu-blocks-override", "24", "--max-num-seqs", "4",
       "--served-model-name", "trt-llama", "--http-api", "trtllm", "--kv-events-config", EVENTS)


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *POD) as s:
        yield s


class Router:
    """One worker's state in TensorRT-LLM's KvCacheAwareRouter (router.py
    `KvCacheAwareServerState`), written from its description, not its code."""

    def __init__(self, tokens_per_block: int) -> None:
        self.tpb, self.blocks = tokens_per_block, set()
        self.ids: list[int] = []

    def update(self, events: list[dict]) -> None:
        for e in events:
            self.ids.append(e["event_id"])
            data = e["data"]
            if data["type"] == "stored":
                self.blocks.update(b["block_hash"] for b in data["blocks"])
            elif data["type"] == "removed":
                self.blocks.difference_update(data["block_hashes"])

    def keys(self, prompt: list[int]) -> list[int]:
        out, parent = [], 0
        for t in range(0, len(prompt) - 1, self.tpb):
            parent = block_key(prompt[t:min(t + self.tpb, len(prompt) - 1)], parent)
            out.append(parent)
        return out

    def matched_tokens(self, prompt: list[int]) -> int:
        n = 0
        for key in self.keys(prompt):
            if key not in self.blocks:
                break
            n += self.tpb
        return n


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % 30000 + 100 for i in range(n)]


async def complete(h, ids: list[int]) -> int:
    """Send one completion; the prompt tokens the pod found in its prefix cache."""
    r = await h.post("/v1/completions", json={"model": "x", "prompt": ids, "max_tokens": 1,
                                              "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


async def test_the_router_sees_what_the_pod_caches(pod):
    async with http_client(pod) as h:
        info = (await h.get("/server_info")).json()
        assert info == {"disaggregated_params": None, "max_batch_size": 4,
                        "kv_cache_hash_algo": "v1_block_key", "tokens_per_block": BLOCK}
        router = Router(info["tokens_per_block"])
        (created,) = (await h.post("/kv_cache_events")).json()
        assert created["event_id"] == 0 and "attention_dp_rank" not in created
        assert created["data"] == {"type": "created", "num_blocks_per_cache_level": [24, 0]}
        assert created["window_size"] == 512
        router.update([created])
        assert (await h.post("/kv_cache_events")).json() == []  # drained

        a = prompt(1, 5 * BLOCK)  # five full blocks
        assert await complete(h, a) == 0
        events = (await h.post("/kv_cache_events")).json()
        (stored,) = [e for e in events if e["data"]["type"] == "stored"]
        blocks = stored["data"]["blocks"]
        assert stored["data"]["parent_hash"] is None and len(blocks) == 5
        assert [[t["token_id"] for t in b["tokens"]] for b in blocks] == [
            a[i:i + BLOCK] for i in range(0, len(a), BLOCK)]
        assert {(b["type"], b["cache_level"], b["priority"]) for b in blocks} == {
            ("stored_block", 0, 35)}
        router.update(events)

        # each prompt is k full blocks and one token, so the router's keys (all but the last
        # token) cover exactly the blocks the pod may reuse; before each request the router
        # has read every event so far, so its count must be the pod's cache hit
        b = a + prompt(2, 2 * BLOCK) + [7]
        others = [[*prompt(10 + i, 8 * BLOCK), 7] for i in range(3)]
        removed, hits = 0, []
        # 24 blocks hold b (7) and two of the others (8 each): the third evicts the oldest;
        # then prompts the cache still holds and prompts it evicted
        for p in (b, *others, others[2], others[1], b, others[0]):
            hits.append(router.matched_tokens(p))
            assert await complete(h, p) == hits[-1]
            events = (await h.post("/kv_cache_events")).json()
            removed += sum(len(e["data"]["block_hashes"]) for e in events
                           if e["data"]["type"] == "removed")
            router.update(events)
        assert hits[0] == 5 * BLOCK and max(hits[4:]) > 0 and min(hits[4:]) == 0
        assert removed > 0 and len(router.blocks) <= 24
        assert router.ids == list(range(len(router.ids)))  # each event once, in order
    await pod_released(pod)
