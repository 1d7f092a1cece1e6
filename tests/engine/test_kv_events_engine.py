"""KV events at the source: the radix cache reports what it really stores, evicts and clears,
with vLLM's block hashes as tests/fixtures/vllm_kv_hashes.json has them (computed by an
independent script from vLLM's algorithm, not by doppelchip)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from server.engine.block_hash import BlockHasher
from server.engine.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KvEventLog,
    encode_batch,
)
from tests.engine.engine_drive import make, request, run

FIXTURE = json.loads((Path(__file__).parent.parent / "fixtures" / "vllm_kv_hashes.json")
                     .read_text())
OLD_FIXTURE = json.loads((Path(__file__).parent.parent / "fixtures" / "kv_block_hashes.json")
                         .read_text())


def case(key: str, name: str) -> dict:
    return next(c for c in FIXTURE["hashes"][key] if c["name"] == name)


def with_events(algo: str = "sha256", seed: str = "vllm-none-hash", **config):
    sched, model = make(**{"num_blocks": 64, "block_size": 16, "max_num_seqs": 4,
                           "max_num_batched_tokens": 512, "max_model_len": 512, **config})
    log = KvEventLog(BlockHasher(algo, seed), 16)
    sched.cache.attach_events(log)
    return sched, model, log


@pytest.mark.parametrize("key", sorted(FIXTURE["hashes"]))
def test_hasher_matches_the_fixture(key: str) -> None:
    """Every case, through what the radix cache calls: the log's hashes in the request's
    namespace (adapter 1 named and placed as the case's LoRA, the case's cache salt), and the
    BlockStored's per-block extra keys."""
    algo, seed = key.split("/")
    hasher = BlockHasher(algo, seed)
    for c in FIXTURE["hashes"][key]:
        bs = c["block_size"]
        toks = c["token_ids"][: len(c["token_ids"]) // bs * bs]
        log = KvEventLog(hasher, bs)
        lora = 1 if c.get("lora_name") else 0
        log.loras = {1: (c["lora_name"], c["lora_path"])} if lora else {}
        ns = (lora, c["cache_salt"]) if c.get("cache_salt") else lora
        got = log.hashes(None, toks, ns)
        assert [h.hex() for h in got] == c["block_hashes_hex"], c["name"]
        assert [hasher.external(h) for h in got] == c["block_hashes_int"], c["name"]
        tail = log.hashes(got[0], toks[bs:], ns)  # a later insertion: no salt on its blocks
        assert [h.hex() for h in tail] == c["block_hashes_hex"][1:], c["name"]
        log.stored(None, got, toks, ns)
        log.stored(got[0], tail, toks[bs:], ns)
        head, rest = log.take()
        wire = msgspec.msgpack.decode(encode_batch(KVEventBatch(ts=0.0, events=[head, rest])))
        assert wire[1][0]["extra_keys"] == c["event_extra_keys"], c["name"]
        assert wire[1][1]["extra_keys"] == c["event_extra_keys"][1:], c["name"]


def test_stored_events_name_a_prompts_full_blocks() -> None:
    sched, model, log = with_events()
    a = case("sha256/vllm-none-hash", "prompt_a_3_blocks_plus_5")
    sched.add_request(request("a", a["token_ids"], max_tokens=1))
    run(sched, model)
    stored = [e for e in log.take() if isinstance(e, BlockStored)]
    hashes = [h for e in stored for h in e.block_hashes]
    assert hashes == a["block_hashes_int"]  # 53 prompt tokens: 3 full blocks, the rest not
    assert stored[0].parent_block_hash is None
    assert [t for e in stored for t in e.token_ids] == a["token_ids"][:48]
    # a second prompt sharing two blocks stores only its third, parented on the shared one
    b = case("sha256/vllm-none-hash", "prompt_b_shares_2_blocks_with_a")
    sched.add_request(request("b", b["token_ids"], max_tokens=1))
    run(sched, model)
    (ev,) = log.take()
    assert isinstance(ev, BlockStored)
    assert ev.block_hashes == b["block_hashes_int"][2:]
    assert ev.parent_block_hash == b["block_hashes_int"][1]


def test_eviction_removes_exactly_the_evicted_blocks_and_reset_clears() -> None:
    sched, model, log = with_events(num_blocks=6)
    a = case("sha256/vllm-none-hash", "prompt_a_3_blocks_plus_5")
    c = case("sha256/vllm-none-hash", "prompt_c_unrelated_2_blocks")
    sched.add_request(request("a", a["token_ids"], max_tokens=1))
    run(sched, model)
    log.take()
    sched.add_request(request("c", c["token_ids"] + [5] * 40, max_tokens=1))  # needs 5 blocks
    run(sched, model)
    events = log.take()
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert removed and set(removed) <= set(a["block_hashes_int"])
    assert all(len(e.block_hashes) == 1 for e in events if isinstance(e, BlockRemoved))
    assert removed == a["block_hashes_int"][::-1][: len(removed)]  # LRU leaf, tail first
    assert sched.cache.reset()
    assert [type(e) for e in log.take()] == [AllBlocksCleared]
    assert sched.cache.cached_blocks == 0
    sched.check_integrity()


def test_reset_is_refused_while_a_request_holds_blocks() -> None:
    sched, model, log = with_events()
    sched.add_request(request("a", list(range(1000, 1053)), max_tokens=4))
    sched.update(out := sched.schedule(), model.next_tokens(out, sched.requests))
    assert sched.has_unfinished()
    assert not sched.cache.reset()
    assert not any(isinstance(e, AllBlocksCleared) for e in log.take())


def test_batch_encoding_is_vllms_bytes() -> None:
    ex = OLD_FIXTURE["event_encoding_example"]
    batch = KVEventBatch(ts=1.5, events=[
        BlockStored(block_hashes=[11, 12], parent_block_hash=None, token_ids=[0, 1, 2, 3],
                    block_size=2, lora_id=None, medium="GPU", lora_name=None, group_idx=0),
        BlockRemoved(block_hashes=[11], medium="GPU", group_idx=0),
        AllBlocksCleared()], data_parallel_rank=0)
    assert encode_batch(batch).hex() == ex["msgpack_hex"]
    assert msgspec.msgpack.decode(encode_batch(batch)) == ex["decoded"]


def test_an_adapters_blocks_hash_with_its_name_as_vllms() -> None:
    """Under a LoRA adapter, vLLM hashes every block with ("lora", name, path) as extra keys
    and the BlockStored carries the adapter's id and name; the base model's blocks stay as
    they were (both from the fixture, computed independently)."""
    sched, model, log = with_events(max_loras=2)
    log.loras = {1: ("sql", "/adapters/sql-lora")}
    lora = case("sha256/vllm-none-hash", "prompt_a_under_lora_sql")
    base = case("sha256/vllm-none-hash", "prompt_a_3_blocks_plus_5")
    assert lora["token_ids"] == base["token_ids"]
    r = request("a-sql", lora["token_ids"], max_tokens=1)
    r.lora_id = 1
    sched.add_request(r)
    run(sched, model)
    stored = [e for e in log.take() if isinstance(e, BlockStored)]
    assert [h for e in stored for h in e.block_hashes] == lora["block_hashes_int"]
    assert {(e.lora_id, e.lora_name) for e in stored} == {(1, "sql")}
    sched.add_request(request("a-base", base["token_ids"], max_tokens=1))
    run(sched, model)
    stored = [e for e in log.take() if isinstance(e, BlockStored)]
    assert [h for e in stored for h in e.block_hashes] == base["block_hashes_int"]
    assert {(e.lora_id, e.lora_name) for e in stored} == {(None, None)}
    assert set(lora["block_hashes_int"]).isdisjoint(base["block_hashes_int"])
    sched.check_integrity()


def test_the_root_is_fixed_for_sha256_and_secret_per_process_for_xxhash(monkeypatch) -> None:
    """vLLM's resolve_none_hash_seed: without PYTHONHASHSEED, SHA-256 roots at the fixed seed
    (pods share hashes), the non-cryptographic xxhash pair at random bytes per process."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert BlockHasher.from_env("sha256").none_hash.hex() == \
        case("sha256/vllm-none-hash", "one_full_block_0_15")["none_hash_hex"]
    for algo in ("xxhash", "xxhash_cbor"):
        assert BlockHasher.from_env(algo).none_hash != BlockHasher.from_env(algo).none_hash
    monkeypatch.setenv("PYTHONHASHSEED", "42")
    for algo in ("xxhash", "xxhash_cbor"):
        assert BlockHasher.from_env(algo).none_hash.hex() == \
            case(f"{algo}/42", "one_full_block_0_15")["none_hash_hex"]
