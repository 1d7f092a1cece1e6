"""The pods' KV events read by smg's own relay code (smg-grpc-servicer 0.14.1,
`smg_grpc_servicer.kv_relay`): its lenient decoder and its normalizer with the engine-hash
check on (`SMG_KV_EVENT_HASH_CHECK`), which recomputes every stored block's hash the engine's
way from the tokens and its parent — SGLang's page chain for a pod that imitates SGLang,
vLLM's `sha256_cbor` (default seed) for a vLLM pod started with that algorithm, a salted
request's blocks included (smg reads the salt back from the first block's extra keys, as a
vLLM 0.33.0 pod publishes them). Nothing is dropped, every store is checked, none
mismatches: smg's code, not doppelchip's, says the hashes are the engines'."""

from __future__ import annotations

import json

import httpx
import pytest
from kv_replay import replayed
from server_proc import ServerProcess
from smg_grpc_servicer import kv_relay

EVENTS = json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://*:0",
                     "replay_endpoint": "tcp://*:0"})
COMMON = ("--chip", "h100-sxm", "--model", "llama-3.1-8b", "--quant", "bf16",
          "--max-model-len", "256", "--block-size", "16", "--num-gpu-blocks-override", "10",
          "--time-scale", "0.05", "--kv-events-config", EVENTS)
PODS = {"sglang": ("--engine", "sglang", "--http-api", "sglang"),
        "vllm-sha256-cbor": ("--engine", "vllm", "--prefix-caching-hash-algo", "sha256_cbor")}


@pytest.mark.parametrize("check", sorted(PODS))
def test_smgs_relay_rehashes_every_stored_block_without_a_mismatch(check):
    with ServerProcess(None, *COMMON, *PODS[check]) as pod:
        line = pod.wait_for_log(r"KV events: publishing on \S+ \(bound\), replay on \S+")
        replay_at = line.rsplit(" ", 1)[1]
        shared = list(range(3000, 3040))
        prompts = [[*shared, 1, 2, 3], shared + list(range(400, 440)),  # a shared prefix
                   list(range(9000, 9120)), [*shared, 5]]  # a long one evicts the oldest
        salted = {"cache_salt": "tenant-a", "session_id": "conv-7"}  # vLLM's own fields
        bodies = [{"prompt": p} for p in prompts] + [{"prompt": shared, **salted}] * (
            check.startswith("vllm"))
        for body in bodies:
            r = httpx.post(f"{pod.http_url}/v1/completions", timeout=30,
                           json={"model": "llama-3.1-8b", "max_tokens": 1, **body})
            assert r.status_code == 200, r.text
        batches = replayed(replay_at)
    normalizer = kv_relay.Normalizer(hash_check=check)
    protos = [normalizer.normalize_batch(kv_relay.decode_batch(payload), seq)
              for seq, payload in batches]
    counts = normalizer.counts
    stored = [b for p in protos for e in p.events if e.HasField("stored")
              for b in e.stored.blocks]
    assert counts.dropped == {} and counts.hash_unverifiable == 0
    assert counts.hash_checked == len(stored) >= 10 and counts.hash_mismatch == 0
    assert counts.forwarded_removed > 0  # the eviction came through too
    if check.startswith("vllm"):  # the salted store: checked with its salt, and named
        (salted,) = [e.stored for p in protos for e in p.events
                     if e.HasField("stored") and e.stored.HasField("cache_salt")]
        assert (salted.cache_salt, salted.session_id) == ("tenant-a", "conv-7")
        assert salted.blocks[0].extra_keys[0].text == "tenant-a"
