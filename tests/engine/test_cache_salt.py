"""vLLM's `cache_salt`: a salted request shares prefix-cache blocks only with requests of the
same salt (and adapter) — not with unsalted ones nor other salts — as vLLM's block hashes,
which key the salt into the first block, keep them apart; its KV events carry vLLM's salted
hashes (tests/fixtures/vllm_kv_hashes.json, computed by an independent script); and salts used
once do not grow the cache's namespaces without bound."""

from __future__ import annotations

import json
from pathlib import Path

from server.engine.block_hash import BlockHasher
from server.engine.kv_events import BlockStored, KvEventLog
from tests.engine.engine_drive import make, request, run

PROMPT = list(range(1000, 1053))  # 3 full blocks and 5 tokens
FIXTURE = json.loads((Path(__file__).parent.parent / "fixtures" / "vllm_kv_hashes.json")
                     .read_text())["hashes"]["sha256/vllm-none-hash"]


def salted(rid: str, salt: str | None, prompt: list[int] = PROMPT):
    r = request(rid, prompt, max_tokens=1)
    r.cache_salt = salt
    return r


def scheduler():
    return make(num_blocks=64, block_size=16, max_num_seqs=4, max_num_batched_tokens=512,
                max_model_len=512)


def test_blocks_are_shared_only_under_the_same_salt():
    sched, model = scheduler()
    sched.add_request(salted("warm", "tenant-a"))
    run(sched, model)
    for rid, salt, hit in (("same", "tenant-a", 48), ("other", "tenant-b", 0),
                           ("unsalted", None, 0), ("again", "tenant-a", 48)):
        r = salted(rid, salt)
        sched.add_request(r)
        run(sched, model)
        assert r.num_cached_tokens == hit, rid
    sched.check_integrity()


def test_a_salted_requests_events_carry_vllms_salted_hashes():
    sched, model = scheduler()
    log = KvEventLog(BlockHasher("sha256", "vllm-none-hash"), 16)
    sched.cache.attach_events(log)
    sched.add_request(salted("a", "tenant-a"))
    run(sched, model)
    (case,) = [c for c in FIXTURE if c["name"] == "prompt_a_with_cache_salt_tenant_a"]
    stored = [h for e in log.take() if isinstance(e, BlockStored) for h in e.block_hashes]
    assert stored == case["block_hashes_int"]
    (plain,) = [c for c in FIXTURE if c["name"] == "prompt_a_3_blocks_plus_5"]
    assert not set(stored) & set(plain["block_hashes_int"])  # every block differs (the chain)


def test_salts_used_once_do_not_accumulate_namespaces():
    sched, model = scheduler()
    for i in range(300):  # prompts shorter than a block: nothing is cached under the salt
        sched.add_request(salted(f"r{i}", f"salt-{i}", [7] * 10))
        run(sched, model)
    assert len(sched.cache.roots) < 130  # swept as they doubled past 64, not 301
    sched.add_request(salted("warm", "kept"))
    run(sched, model)
    for i in range(300):
        sched.add_request(salted(f"s{i}", f"other-{i}", [7] * 10))
        run(sched, model)
    r = salted("hit", "kept")  # a namespace with cached blocks survives the sweeps
    sched.add_request(r)
    run(sched, model)
    assert r.num_cached_tokens == 48
    sched.check_integrity()
