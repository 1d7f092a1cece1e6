"""vLLM 0.33.0's per-request KV-event fields at the source: the storing request's
`session_id` on the blocks it stores, and `kv_cache_report_mode: "full"`, which reports a
prefix-cache hit as a BlockStored naming the reused blocks from the root
(`emit_cached_block_events`). Hashes and extra keys from tests/fixtures/vllm_kv_hashes.json
(an independent generator, checked against vLLM 0.33.0's own functions)."""

from __future__ import annotations

import json
from pathlib import Path

from server.engine.block_hash import BlockHasher
from server.engine.kv_events import BlockStored, KvEventLog
from tests.engine.engine_drive import make, request, run

FIXTURE = {c["name"]: c for c in json.loads(
    (Path(__file__).parent.parent / "fixtures" / "vllm_kv_hashes.json").read_text()
)["hashes"]["sha256/vllm-none-hash"]}
PLAIN = FIXTURE["prompt_a_3_blocks_plus_5"]
SALTED = FIXTURE["prompt_a_with_cache_salt_tenant_a"]
PROMPT = PLAIN["token_ids"]  # 3 full blocks and 5 tokens


def engine():
    sched, model = make(num_blocks=64, block_size=16, max_num_seqs=4,
                        max_num_batched_tokens=512, max_model_len=512)
    log = KvEventLog(BlockHasher("sha256", "vllm-none-hash"), 16)
    sched.cache.attach_events(log)
    return sched, model, log


def served(sched, model, log, rid: str, *, session: str | None = None,
           mode: str = "incremental", salt: str | None = None) -> list[BlockStored]:
    r = request(rid, PROMPT, max_tokens=1)
    r.session_id, r.kv_cache_report_mode, r.cache_salt = session, mode, salt
    sched.add_request(r)
    run(sched, model)
    return [e for e in log.take() if isinstance(e, BlockStored)]


def untagged(e: BlockStored) -> list:
    """The event's extra keys as the wire carries them (each block's keys a list)."""
    return [list(k) if k is not None else None for k in e.extra_keys]


def test_stored_blocks_name_the_session_that_stored_them():
    sched, model, log = engine()
    (first,) = served(sched, model, log, "a", session="conv-1")
    assert first.session_id == "conv-1"
    assert first.block_hashes == PLAIN["block_hashes_int"]
    assert untagged(first) == PLAIN["event_extra_keys"]  # [None, None, None], as vLLM sends
    other = request("b", list(range(5000, 5040)), max_tokens=1)  # no session
    sched.add_request(other)
    run(sched, model)
    assert [e.session_id for e in log.take() if isinstance(e, BlockStored)] == [None]
    sched.check_integrity()


def test_full_report_mode_tells_of_a_prefix_hit_from_the_root():
    sched, model, log = engine()
    served(sched, model, log, "warm", session="conv-1")
    assert served(sched, model, log, "quiet", session="conv-2") == []  # incremental: nothing
    (hit,) = served(sched, model, log, "loud", session="conv-3", mode="full")
    assert hit.parent_block_hash is None
    assert hit.block_hashes == PLAIN["block_hashes_int"]  # the 3 reused blocks (48 tokens)
    assert hit.token_ids == PROMPT[:48]
    assert (hit.session_id, hit.extra_keys, hit.medium) == ("conv-3", [None] * 3, "GPU")
    assert log.blocks_stored == 3  # a report is no new store
    sched.check_integrity()


def test_a_salted_hit_reports_the_salt_on_its_first_block():
    sched, model, log = engine()
    (stored,) = served(sched, model, log, "warm", salt="tenant-a")
    assert untagged(stored) == SALTED["event_extra_keys"] == [["tenant-a"], None, None]
    (hit,) = served(sched, model, log, "again", salt="tenant-a", mode="full")
    assert hit.block_hashes == SALTED["block_hashes_int"]
    assert untagged(hit) == SALTED["event_extra_keys"]
    assert served(sched, model, log, "miss", salt="tenant-b", mode="full") != []  # a store
    sched.check_integrity()
