"""TensorRT-LLM's KV cache events made of the engine's (vLLM's format): block keys equal to
what TensorRT-LLM's C++ `BlockKeyHasher` computes (the fixture comes from a C++ program), each
block chained to its parent's key, blocks moving between device and host memory said as
`updated`, a reset as `removed`, and a block whose parent was never seen not announced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from server.kv_events.trtllm_events import TrtllmEvents
from server.kv_events.trtllm_hash import block_key, chain

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "trtllm_block_hashes.json")
                     .read_text())
BS = 4


@pytest.mark.parametrize("case", FIXTURE, ids=[c["name"] for c in FIXTURE])
def test_block_keys_are_tensorrt_llms(case):
    got = chain(case["tokens"], case["block_size"], 0, case["lora_task_id"])
    assert [str(k) for k in got] == case["block_hashes"]


def stored(hashes, parent, tokens, medium="GPU", lora=None):
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens,
                       block_size=BS, lora_id=lora, medium=medium, lora_name=None)


def convert(events: TrtllmEvents, *evs) -> list[dict]:
    return events.convert(KVEventBatch(ts=0.0, events=list(evs)))


@pytest.fixture
def ev():
    return TrtllmEvents(num_blocks=10, host_blocks=6, window_size=64, dp_rank=None)


def test_stored_blocks_chain_from_their_parents_key(ev):
    assert ev.created() == {"event_id": 0, "window_size": 64, "data": {
        "type": "created", "num_blocks_per_cache_level": [10, 6]}}
    toks = list(range(100, 112))
    (first,) = convert(ev, stored([11, 12], None, toks[:8]))
    keys = chain(toks[:8], BS)
    assert first["event_id"] == 1 and first["data"]["parent_hash"] is None
    assert [b["block_hash"] for b in first["data"]["blocks"]] == keys
    (second,) = convert(ev, stored([13], 12, toks[8:]))
    assert second["data"]["parent_hash"] == keys[-1]
    assert second["data"]["blocks"][0]["block_hash"] == chain(toks, BS)[-1]
    (lora,) = convert(ev, stored([21], None, toks[:4], lora=3))
    assert lora["data"]["blocks"][0]["block_hash"] == block_key(toks[:4], 0, 3) != keys[0]


def test_host_copies_move_blocks_between_cache_levels(ev):
    convert(ev, stored([1, 2], None, list(range(8))))
    # vLLM's offloading tier: a CPU copy (a placeholder without tokens), then the GPU eviction
    assert convert(ev, stored([1], None, [], medium="CPU")) == []
    (moved,) = convert(ev, BlockRemoved(block_hashes=[1], medium="GPU"))
    key = chain(list(range(8)), BS)[0]
    assert moved["data"] == {"type": "updated", "block_hash": key, "priority": None,
                             "cache_level": {"type": "event_diff", "old_value": 0,
                                             "new_value": 1}}
    (back,) = convert(ev, stored([1], None, list(range(4))))  # loaded back to the device
    assert back["data"]["cache_level"] == {"type": "event_diff", "old_value": 1,
                                           "new_value": 0}
    # a reset empties the device only: block 1 keeps its host copy, block 2 is gone
    moved, gone = convert(ev, AllBlocksCleared())
    assert (moved["data"]["type"], moved["data"]["cache_level"]["new_value"]) == ("updated", 1)
    assert gone["data"] == {"type": "removed", "block_hashes": [chain(list(range(8)), BS)[1]]}
    assert [e["data"]["type"] for e in convert(
        ev, BlockRemoved(block_hashes=[1], medium="GPU"),
        BlockRemoved(block_hashes=[1], medium="CPU"))] == ["removed"]
    assert ev.blocks == {}


def test_a_block_whose_parent_was_lost_is_not_announced(ev):
    assert convert(ev, stored([5], 4, list(range(4)))) == []
    assert convert(ev, BlockRemoved(block_hashes=[5], medium="GPU")) == []
    dp = TrtllmEvents(num_blocks=1, host_blocks=0, window_size=8, dp_rank=2)
    assert dp.created()["attention_dp_rank"] == 2
