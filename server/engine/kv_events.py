"""KV-cache events as vLLM publishes them, collected where the prefix cache changes.

The structs mirror vLLM 0.33.0's `vllm/distributed/kv_events.py` field for field and with its
msgspec options, because their msgpack encoding *is* the protocol: `KVEventBatch` is
array-like, `[ts, events, data_parallel_rank]`; each event is a tagged map
(`{"type": "BlockStored", ...}`) whose fields equal to their default are omitted. vLLM sets
`group_idx` (0 for a plain model); a device store carries `extra_keys`, one entry per block
(None, or the block's untagged hash keys: the adapter's name, the cache salt on a sequence's
first block; `to_event_extra_keys`), and the storing request's `session_id`; the later optional
fields (`kv_cache_spec_kind`, `locality`, `ownership`, `lookahead_token_ids`) stay unset.

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
    `reused` when a request that asked for vLLM's `kv_cache_report_mode: "full"` finds a cached
    prefix; `removed` once per evicted block; `cleared` after a reset emptied the cache.
    `take()` hands the events over and starts the next step's list. Counters feed the
    metrics."""

    __slots__ = ("block_size", "blocks_removed", "blocks_stored", "cleared_count", "events",
                 "hasher", "loras")

    def __init__(self, hasher: BlockHasher | SglangBlockHasher, block_size: int) -> None:
        self.hasher, self.block_size = hasher, block_size
        self.events: list[KVCacheEvent] = []
        self.blocks_stored = self.blocks_removed = self.cleared_count = 0
        # LoRA id -> (name, path) (the engine's adapter registry, when LoRA is on): an
        # adapter's blocks hash with ("lora", name, path) as vLLM's extra keys, and its
        # events carry its id and name
        self.loras: dict[int, tuple[str, str]] = {}

    def _split(self, ns: Namespace) -> tuple[int, tuple[str, str] | None, str | None]:
        """(LoRA id, the adapter's (name, path) or None, cache salt) of a namespace."""
        lora, salt = (ns, None) if isinstance(ns, int) else ns
        return lora, self.loras.get(lora) if lora else None, salt

    def hashes(self, parent: bytes | None, token_ids: Sequence[int],
               ns: Namespace = 0) -> list[bytes]:
        """vLLM's hashes of whole blocks of `token_ids` after `parent`, in namespace `ns` (a
        LoRA id, or (id, cache_salt)): `generate_block_hash_extra_keys`' tagged keys,
        ("lora", name, path) on every block of an adapter's request, then ("cache_salt",
        salt) on the first block of a sequence only."""
        _, adapter, salt = self._split(ns)
        extra, bs = (("lora", *adapter),) if adapter else None, self.block_size
        if salt is None or parent is not None or len(token_ids) < bs:
            return self.hasher.chain(parent, token_ids, bs, extra)
        head = self.hasher.chain(None, token_ids[:bs], bs, (*(extra or ()), ("cache_salt", salt)))
        return head + self.hasher.chain(head[0], token_ids[bs:], bs, extra)

    def _event_keys(self, first: bool, n: int, adapter: tuple[str, str] | None,
                    salt: str | None) -> list[tuple[str, ...] | None]:
        """vLLM's `to_event_extra_keys` of `n` blocks (`first`: the first is the sequence's
        block 0): each block's hash keys untagged, the adapter's bare name and the bare salt;
        None for a block without any (a list of Nones for a plain request, as vLLM sends)."""
        name = (adapter[0],) if adapter else ()
        rest = name or None
        if first and salt is not None:
            return [(*name, salt)] + [rest] * (n - 1)
        return [rest] * n

    def stored(self, parent: bytes | None, hashes: Sequence[bytes],
               token_ids: Sequence[int], ns: Namespace = 0, medium: str = MEDIUM_GPU,
               session_id: str | None = None) -> None:
        """A store of new full blocks. A device store is the block pool's event (its extra
        keys, the storing request's session); another tier's is the offloading connector's,
        which carries neither."""
        device = medium == MEDIUM_GPU
        self.events.append(self._block_stored(parent, hashes, token_ids, ns, medium,
                                              session_id if device else None, device))
        if device:
            self.blocks_stored += len(hashes)

    def reused(self, hashes: Sequence[bytes], token_ids: Sequence[int], ns: Namespace,
               session_id: str | None) -> None:
        """vLLM's `emit_cached_block_events`: a request with `kv_cache_report_mode: "full"`
        found its first `len(hashes)` blocks cached; one BlockStored names them all from the
        root (parent None), so a consumer that missed the original stores learns them. The
        blocks were already stored: the stored-blocks count does not grow."""
        self.events.append(self._block_stored(None, hashes, token_ids, ns, MEDIUM_GPU,
                                              session_id, True))

    def _block_stored(self, parent: bytes | None, hashes: Sequence[bytes],
                      token_ids: Sequence[int], ns: Namespace, medium: str,
                      session_id: str | None, keys: bool) -> BlockStored:
        """The BlockStored of `hashes` after `parent`; `keys`: with vLLM's per-block extra
        keys (the block pool's events; the offloading connector's carry none)."""
        ext = self.hasher.external
        lora, adapter, salt = self._split(ns)
        return BlockStored(
            block_hashes=[ext(h) for h in hashes],
            parent_block_hash=ext(parent) if parent is not None else None,
            token_ids=list(token_ids), block_size=self.block_size,
            lora_id=lora if adapter else None, medium=medium,
            lora_name=adapter[0] if adapter else None,
            extra_keys=(self._event_keys(parent is None, len(hashes), adapter, salt)
                        if keys else None),
            group_idx=0, session_id=session_id)

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
               ns: Namespace = 0) -> list[bytes]:
        return self.log.hashes(parent, token_ids, ns)

    def stored(self, parent: bytes | None, hashes: Sequence[bytes],
               token_ids: Sequence[int], ns: Namespace = 0,
               session_id: str | None = None) -> None:
        if self.self_describing:
            self.log.stored(parent, hashes, token_ids, ns, self.medium)
        else:
            self.log.stored_placeholders(hashes, self.medium)

    def removed(self, hashes: Sequence[bytes]) -> None:
        self.log.removed(hashes, self.medium)

    def cleared(self) -> None:
        """(Unused: the tier's reset reports its blocks through `removed`.)"""
