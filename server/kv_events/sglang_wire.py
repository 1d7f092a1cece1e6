"""SGLang's KV-event wire format, for pods that imitate SGLang (`--http-api sglang` or
`--grpc-api sglang`): what llm-d's KV-cache indexer decodes with its SGLang adapter
(`pkg/kvevents/engineadapter/sglang_adapter.go`) and smg reads from an SGLang worker.

Why a second encoding of the same events: SGLang's publisher (`sglang/srt/disaggregation/
kv_events.py`, a fork of vLLM's) kept the positional form vLLM has since left. A batch is
`[ts, events, attn_dp_rank]`; each event an array whose first element is its tag, every field
present (no `omit_defaults`):

    ["BlockStored", [hash], parent_hash | nil, token_ids, block_size, lora_id (nil), medium]
    ["BlockRemoved", [hash], medium]
    ["AllBlocksCleared"]

One event per page (`KVCacheEventMixin._record_store_event` / `_record_remove_event`): a
vLLM-style event covering n blocks becomes n events, each page's parent the page before it.
Hashes are SGLang's (`server.engine.block_hash.SglangBlockHasher`: signed 64-bit); media are
SGLang's `StorageMedium` names ("GPU", "CPU_PINNED" for host memory). The ZeroMQ framing is
vLLM's, except that SGLang's replay answers `[seq, payload]` without the topic frame
(`_service_replay`); `publisher.py` and `relay.replay` follow that.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from server.engine.kv_events import (
    MEDIUM_CPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVEventBatch,
)

WIRES = ("vllm", "sglang")
MEDIA = {MEDIUM_CPU: "CPU_PINNED"}  # ours -> SGLang's (others: the same name)
OURS = {v: k for k, v in MEDIA.items()}


class _Batch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


class _Event(msgspec.Struct, array_like=True, gc=False, tag=True):
    pass


class _Stored(_Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class _Removed(_Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class _Cleared(_Event, tag="AllBlocksCleared"):
    pass


class _Batches(_Batch):
    events: list[_Stored | _Removed | _Cleared]


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(_Batches).decode


def _medium(m: str | None) -> str | None:
    return MEDIA.get(m, m) if m is not None else None


def encode(events: list[KVCacheEvent], rank: int | None) -> bytes:
    """One step's events (the engine's, vLLM-shaped) as SGLang publishes them."""
    out: list[_Event] = []
    for e in events:
        if isinstance(e, BlockStored):
            parent, bs, medium = e.parent_block_hash, e.block_size, _medium(e.medium)
            for i, h in enumerate(e.block_hashes):
                tokens = e.token_ids[i * bs:(i + 1) * bs]
                out.append(_Stored([h], parent, tokens, len(tokens) or bs, None, medium))
                parent = h
        elif isinstance(e, BlockRemoved):
            out += [_Removed([h], _medium(e.medium)) for h in e.block_hashes]
        elif isinstance(e, AllBlocksCleared):
            out.append(_Cleared())
    return _encode(_Batch(time.time(), out, rank))


def decode(payload: bytes) -> KVEventBatch:
    """An SGLang batch as the engine's own events (for the gRPC relay and the HTTP routes)."""
    b = _decode(payload)
    out: list[Any] = []
    for e in b.events:
        if isinstance(e, _Stored):
            out.append(BlockStored(block_hashes=e.block_hashes,
                                   parent_block_hash=e.parent_block_hash, token_ids=e.token_ids,
                                   block_size=e.block_size, lora_id=e.lora_id,
                                   medium=OURS.get(e.medium or "", e.medium), lora_name=None))
        elif isinstance(e, _Removed):
            out.append(BlockRemoved(block_hashes=e.block_hashes,
                                    medium=OURS.get(e.medium or "", e.medium)))
        else:
            out.append(AllBlocksCleared())
    return KVEventBatch(ts=b.ts, events=out, data_parallel_rank=b.attn_dp_rank)
