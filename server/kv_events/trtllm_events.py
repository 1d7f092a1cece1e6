"""TensorRT-LLM's KV cache events, made of the engine's own (vLLM's format) for one rank.

Why a conversion and not a second publisher: the engine core's radix cache is the one writer
of the cache and publishes once, as vLLM (`publisher.py`); a TensorRT-LLM pod's front end reads
those batches and says the same changes in TensorRT-LLM's words, the JSON that trtllm-serve's
`POST /kv_cache_events` returns (`tensorrt_llm/_utils.py` `KVCacheEventSerializer`):

    {"event_id": n, "data": {...}, "window_size": w[, "attention_dp_rank": r]}

with `data` one of
- `{"type": "created", "num_blocks_per_cache_level": [primary, secondary]}`: the first event;
- `{"type": "stored", "parent_hash": key | null, "blocks": [{"type": "stored_block",
  "block_hash": key, "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0}],
  "cache_level": 0 | 1, "priority": 35}]}`: blocks newly reusable, in prefix order;
- `{"type": "removed", "block_hashes": [key, ...]}`: blocks no longer reusable;
- `{"type": "updated", "block_hash": key, "cache_level": {"type": "event_diff", "old_value",
  "new_value"}, "priority": null}`: a block moved between device (0) and host (1) memory.

Keys are TensorRT-LLM's (`trtllm_hash.block_key`), chained from the parent's key, so a router
that hashes a prompt as TensorRT-LLM's `KvCacheAwareRouter` does finds the blocks it holds.
State per engine block: its key and the media holding it (vLLM's "GPU"/"CPU"): stored when a
first medium holds it, updated when it leaves or regains the device, removed when none holds
it (TensorRT-LLM offloads an evicted block to host memory instead of dropping it, which vLLM's
offloading tier says as a GPU removal next to a CPU copy). Not said: partial blocks (the
engine caches full blocks only) and events of batches that never arrived (a gap: logged).
"""

from __future__ import annotations

import logging
from typing import Any

from server.engine.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)
from server.kv_events.trtllm_hash import block_key

log = logging.getLogger("doppelchip.kv_events")

DEFAULT_PRIORITY = 35  # TensorRT-LLM's KvCacheRetentionConfig::kDefaultRetentionPriority


class _Block:
    __slots__ = ("key", "media")

    def __init__(self, key: int, medium: str) -> None:
        self.key, self.media = key, {medium}

    @property
    def level(self) -> int:
        return 0 if MEDIUM_GPU in self.media else 1


class TrtllmEvents:
    """One rank's events. Contract: `convert` is given the rank's batches in sequence order
    (one writer: the route that drains them, under its lock); `created` is the first event."""

    def __init__(self, *, num_blocks: int, host_blocks: int, window_size: int,
                 dp_rank: int | None) -> None:
        self.num_blocks, self.host_blocks = num_blocks, host_blocks
        self.window_size, self.dp_rank = window_size, dp_rank
        self.blocks: dict[int | bytes, _Block] = {}  # engine hash -> block
        self.next_id = 0

    def _event(self, data: dict[str, Any]) -> dict[str, Any]:
        out = {"event_id": self.next_id, "data": data, "window_size": self.window_size}
        if self.dp_rank is not None:
            out["attention_dp_rank"] = self.dp_rank
        self.next_id += 1
        return out

    def created(self) -> dict[str, Any]:
        return self._event({"type": "created",
                            "num_blocks_per_cache_level": [self.num_blocks, self.host_blocks]})

    def convert(self, batch: KVEventBatch) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for e in batch.events:
            if isinstance(e, BlockStored):
                self._stored(e, out)
            elif isinstance(e, BlockRemoved):
                self._removed(e.block_hashes, e.medium or MEDIUM_GPU, out)
            elif isinstance(e, AllBlocksCleared):
                self._removed(list(self.blocks), MEDIUM_GPU, out)
        return out

    def _stored(self, e: BlockStored, out: list[dict[str, Any]]) -> None:
        medium, bs = e.medium or MEDIUM_GPU, e.block_size
        parent: int | None = None
        if e.parent_block_hash is not None:
            known = self.blocks.get(e.parent_block_hash)
            if known is None:
                log.warning("KV events: a stored block's parent is unknown (a batch was lost); "
                            "its %d blocks are not announced", len(e.block_hashes))
                return
            parent = known.key
        run: list[dict[str, Any]] = []
        run_parent = parent
        for i, h in enumerate(e.block_hashes):
            block = self.blocks.get(h)
            if block is not None:  # another copy (host memory) of a block already announced
                self._flush(run_parent, run, out)
                run, run_parent = [], block.key
                self._move(block, medium, True, out)
                parent = block.key
                continue
            tokens = e.token_ids[i * bs:(i + 1) * bs]
            if len(tokens) < bs:  # a placeholder (no tokens) for a block never announced
                continue
            key = block_key(tokens, parent or 0, e.lora_id)
            self.blocks[h] = block = _Block(key, medium)
            run.append({"type": "stored_block", "block_hash": key,
                        "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0}
                                   for t in tokens],
                        "cache_level": block.level, "priority": DEFAULT_PRIORITY})
            parent = key
        self._flush(run_parent, run, out)

    def _flush(self, parent: int | None, run: list[dict[str, Any]],
               out: list[dict[str, Any]]) -> None:
        if run:
            out.append(self._event({"type": "stored", "parent_hash": parent, "blocks": run}))

    def _removed(self, hashes: list[int | bytes], medium: str, out: list[dict[str, Any]]) -> None:
        gone: list[int] = []
        for h in hashes:
            block = self.blocks.get(h)
            if block is None or medium not in block.media:
                continue
            if len(block.media) == 1:
                del self.blocks[h]
                gone.append(block.key)
            else:
                self._move(block, medium, False, out)
        if gone:
            out.append(self._event({"type": "removed", "block_hashes": gone}))

    def _move(self, block: _Block, medium: str, held: bool, out: list[dict[str, Any]]) -> None:
        """`medium` now holds the block (or no longer does); an `updated` event when its
        cache level changes."""
        old = block.level
        if held:
            block.media.add(medium)
        else:
            block.media.discard(medium)
        if block.level != old:
            out.append(self._event({"type": "updated", "block_hash": block.key,
                                    "cache_level": {"type": "event_diff", "new_value":
                                                    block.level, "old_value": old},
                                    "priority": None}))
