"""KV-cache events as vLLM publishes them, collected where the prefix cache changes.

The structs mirror vLLM 0.33.0's `vllm/distributed/kv_events.py` field for field and with its
msgspec options, because their msgpack encoding *is* the protocol: `KVEventBatch` is
array-like, `[ts, events, data_parallel_rank]`; each event is a tagged map
(`{"type": "BlockStored", ...}`) whose fields equal to their default are omitted. vLLM sets
`group_idx` (0 for a plain model) and leaves the later optional fields (`extra_keys`,
`kv_cache_spec_kind`, `locality`, `ownership`, `session_id`, `lookahead_token_ids`) unset for
a request without LoRA, multimodal input or cache salt; so do we.

`KvEventLog` is the boundary object between the radix cache (the one writer of the cache, in
the engine core) and whoever publishes: the cache reports what it really stored, evicted and
cleared, with vLLM's block hashes (`block_hash.py`); the engine loop takes the step's events
once per step and hands them to the publisher (`server/kv_events/`). When no deployment option
asks for events, no log exists and nothing is hashed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from .block_hash import BlockHasher, SglangBlockHasher
from .prefix_cache import Namespace

MEDIUM_GPU = "GPU"  # vLLM's medium for device memory (our KV pool)
MEDIUM_CPU = "CPU"  # vLLM's medium for host memory (the CPU offloading tier: kv_offload.py)


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """The base of the tagged events (the tag is the class name, in the field "type")."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


encode_batch = msgspec.msgpack.Encoder().encode
decode_batch = msgspec.msgpack.Decoder(KVEventBatch).decode


class KvEventLog:
    """The events of the current step, in the order the cache changed.

    Contract: `stored` is called once per insertion of new full blocks into the cache (one
    event covering them, `parent` the hash of the block before them or None at the root);
    `removed` once per evicted block; `cleared` after a reset emptied the cache. `take()` hands
    the events over and starts the next step's list. Counters feed the metrics."""

    __slots__ = ("block_size", "blocks_removed", "blocks_stored", "cleared_count", "events",
                 "hasher", "lora_names")

    def __init__(self, hasher: BlockHasher | SglangBlockHasher, block_size: int) -> None:
        self.hasher, self.block_size = hasher, block_size
        self.events: list[KVCacheEvent] = []
        self.blocks_stored = self.blocks_removed = self.cleared_count = 0
        # LoRA id -> name (the engine's adapter registry, when LoRA is on): an adapter's
        # blocks hash with (lora_name,) as vLLM's extra keys and carry its id and name
        self.lora_names: dict[int, str] = {}

    def _extra(self, lora: int) -> tuple[str, ...] | None:
        name = self.lora_names.get(lora) if lora else None
        return (name,) if name else None

    def hashes(self, parent: bytes | None, token_ids: Sequence[int],
               ns: Namespace = 0) -> list[bytes]:
        """vLLM's hashes of whole blocks of `token_ids` after `parent`, in namespace `ns` (a
        LoRA id, or (id, cache_salt)): the adapter's name on every block, the salt on the first
        block of a sequence only (`generate_block_hash_extra_keys`)."""
        lora, salt = (ns, None) if isinstance(ns, int) else ns
        extra, bs = self._extra(lora), self.block_size
        if salt is None or parent is not None or len(token_ids) < bs:
            return self.hasher.chain(parent, token_ids, bs, extra)
        head = self.hasher.chain(None, token_ids[:bs], bs, (*(extra or ()), salt))
        return head + self.hasher.chain(head[0], token_ids[bs:], bs, extra)

    def stored(self, parent: bytes | None, hashes: Sequence[bytes],
               token_ids: Sequence[int], ns: Namespace = 0, medium: str = MEDIUM_GPU) -> None:
        ext = self.hasher.external
        lora = ns if isinstance(ns, int) else ns[0]
        name = self.lora_names.get(lora) if lora else None
        self.events.append(BlockStored(
            block_hashes=[ext(h) for h in hashes],
            parent_block_hash=ext(parent) if parent is not None else None,
            token_ids=list(token_ids), block_size=self.block_size,
            lora_id=lora if name else None, medium=medium, lora_name=name, group_idx=0))
        if medium == MEDIUM_GPU:
            self.blocks_stored += len(hashes)

    def stored_placeholders(self, hashes: Sequence[bytes], medium: str) -> None:
        """vLLM's offloading connector without `self_describing_kv_events` (its default):
        one BlockStored per stored block naming only its hash (no parent, no tokens, block
        size 0; `OffloadingEventsTracker._placeholder_stored`)."""
        ext = self.hasher.external
        for h in hashes:
            self.events.append(BlockStored(
                block_hashes=[ext(h)], parent_block_hash=None, token_ids=[], block_size=0,
                lora_id=None, medium=medium, lora_name=None, group_idx=0))

    def removed(self, hashes: Sequence[bytes], medium: str = MEDIUM_GPU) -> None:
        ext = self.hasher.external
        if medium != MEDIUM_GPU:  # the offloading connector: one event per eviction
            self.events.append(BlockRemoved(block_hashes=[ext(h) for h in hashes],
                                            medium=medium, group_idx=0))
            return
        for h in hashes:  # vLLM: one BlockRemoved per evicted block
            self.events.append(BlockRemoved(block_hashes=[ext(h)], medium=MEDIUM_GPU,
                                            group_idx=0))
        self.blocks_removed += len(hashes)

    def cleared(self) -> None:
        self.events.append(AllBlocksCleared())
        self.cleared_count += 1

    def take(self) -> list[KVCacheEvent]:
        events, self.events = self.events, []
        return events


class MediumLog:
    """The `KvEventLog` interface a prefix cache reports to, for a tier other than the device
    (the CPU offloading tier's radix tree): the same shared log, so one step's events keep
    the order the tiers changed in, with that tier's medium. Stores carry vLLM's full
    payload only with `self_describing` (the connector's `self_describing_kv_events`);
    a reset of the tier is not an `AllBlocksCleared` of the device cache, so it reports its
    blocks as removed."""

    __slots__ = ("log", "medium", "self_describing")

    def __init__(self, log: KvEventLog, medium: str, self_describing: bool = False) -> None:
        self.log, self.medium, self.self_describing = log, medium, self_describing

    def hashes(self, parent: bytes | None, token_ids: Sequence[int],
               lora: int = 0) -> list[bytes]:
        return self.log.hashes(parent, token_ids, lora)

    def stored(self, parent: bytes | None, hashes: Sequence[bytes],
               token_ids: Sequence[int], lora: int = 0) -> None:
        if self.self_describing:
            self.log.stored(parent, hashes, token_ids, lora, self.medium)
        else:
            self.log.stored_placeholders(hashes, self.medium)

    def removed(self, hashes: Sequence[bytes]) -> None:
        self.log.removed(hashes, self.medium)

    def cleared(self) -> None:
        """(Unused: the tier's reset reports its blocks through `removed`.)"""
