"""`VllmEngine.SubscribeKvEvents`: the engine's ZeroMQ stream relayed as gRPC, for smg.

Why a relay and not a second stream: the engine core publishes once (`publisher.py`); the
front end subscribes to that PUB socket like any subscriber and converts each batch, exactly
as smg's own vLLM servicer does (`smg_grpc_servicer/vllm/kv_events.py`, `stream_kv_events`
and `convert_batch`): the ZeroMQ sequence number becomes `KvEventBatch.sequence_number`, each
`BlockStored` becomes one `KvBlocksStored` with one `KvBlock` per block (its slice of the token
ids), `BlockRemoved` a `KvBlocksRemoved`, `AllBlocksCleared` a `KvCacheCleared`; block hashes
(unsigned 64-bit on the ZeroMQ wire) become the proto's signed int64, two's complement.

Every data-parallel rank publishes its own stream with its own sequence; the servicer relays
them all as one (`merge`), each batch under its rank's sequence number and with its `dp_rank`,
as smg-grpc-servicer 0.14.1's relay does. Beyond that relay (which streams live events only and
refuses a resumption): a `start_sequence_number` > 0 is served, on each rank, from the
publisher's replay socket when the deployment has one (vLLM's replay protocol), and a gap in
the live stream is refilled from it the same way; what the buffer no longer holds ends the
stream with `HistoryLost` (DATA_LOSS), as smg's relay ends it. Without a replay socket the
stream is live only, and any gap ends it. When the engine restarts (its epoch changes), its
publisher counts from 0 again on the same endpoints: the relay ends with `PublisherRestarted`,
which the servicer answers DATA_LOSS, as smg's servicer ends its live subscribers then; a
subscriber subscribes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import zmq
import zmq.asyncio
from smg_grpc_proto.generated import common_pb2

from server.engine.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
)
from server.kv_events import sglang_wire
from server.kv_events.publisher import END_SEQ

log = logging.getLogger("doppelchip.kv_events")

DISABLED = ("KV cache events not enabled. Start vLLM with --kv-events-config "
            '\'{"enable_kv_cache_events": true, "publisher": "zmq"}\'')  # smg servicer's words
TIER = {"GPU": common_pb2.KV_CACHE_TIER_DEVICE, "CPU": common_pb2.KV_CACHE_TIER_HOST,
        "STORAGE": common_pb2.KV_CACHE_TIER_DISK}
REPLAY_TIMEOUT_S = 2.0
RESTARTED = "KV event publisher restarted"  # smg's servicer's words


class PublisherRestarted(Exception):
    """The engine behind the stream restarted: its sequence numbers start over."""


class HistoryLost(Exception):
    """Batches the stream needs are in neither the live stream nor the replay buffer: a
    subscriber's index would silently diverge, so the stream ends (DATA_LOSS, smg's answer,
    upon which the gateway clears the worker and subscribes again)."""


def decoder(wire: str) -> Callable[[bytes], KVEventBatch]:
    """How a deployment's batches decode (`DeploymentInfo.kv_events_wire`)."""
    return sglang_wire.decode if wire == "sglang" else decode_batch


def to_int64(h: int | bytes) -> int:
    value = int.from_bytes(h[-8:], "big") if isinstance(h, bytes) else h
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def to_proto(batch: KVEventBatch, seq: int, first_event_id: int) -> common_pb2.KvEventBatch:
    out = common_pb2.KvEventBatch(sequence_number=seq, timestamp=batch.ts)
    if batch.data_parallel_rank is not None:
        out.dp_rank = batch.data_parallel_rank
    event_id = first_event_id
    for e in batch.events:
        event_id += 1
        if isinstance(e, BlockStored):
            bs = e.block_size
            stored = common_pb2.KvBlocksStored(blocks=[
                common_pb2.KvBlock(block_hash=to_int64(h), block_size=bs,
                                   token_ids=e.token_ids[i * bs:(i + 1) * bs])
                for i, h in enumerate(e.block_hashes)])
            if e.parent_block_hash is not None:
                stored.parent_block_hash = to_int64(e.parent_block_hash)
            _place(stored, e)
            out.events.append(common_pb2.KvCacheEvent(event_id=event_id, stored=stored))
        elif isinstance(e, BlockRemoved):
            removed = common_pb2.KvBlocksRemoved(block_hashes=[to_int64(h)
                                                                for h in e.block_hashes])
            _place(removed, e)
            out.events.append(common_pb2.KvCacheEvent(event_id=event_id, removed=removed))
        elif isinstance(e, AllBlocksCleared):
            out.events.append(common_pb2.KvCacheEvent(event_id=event_id,
                                                      cleared=common_pb2.KvCacheCleared()))
    return out


async def replay(ctx: zmq.asyncio.Context, endpoint: str, start: int
                 ) -> list[tuple[int, bytes]]:
    """vLLM's replay: one REQ frame with the start sequence; batches until the end marker."""
    sock = ctx.socket(zmq.DEALER)  # a DEALER sends [b"", start], as a REQ would
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    out: list[tuple[int, bytes]] = []
    try:
        await sock.send_multipart((b"", start.to_bytes(8, "big")))
        while True:
            frames = await asyncio.wait_for(sock.recv_multipart(), REPLAY_TIMEOUT_S)
            seq, payload = frames[-2:]  # after [b"", topic] (vLLM) or [b""] (SGLang)
            if seq == END_SEQ:
                return out
            out.append((int.from_bytes(seq, "big"), payload))
    except TimeoutError:
        log.warning("KV events: replay from %s timed out after %d batches", endpoint, len(out))
        return out
    finally:
        sock.close(linger=0)


async def relay(endpoint: str, replay_endpoint: str, topic: str, start: int,
                cancelled: Callable[[], bool], epoch: Callable[[], int] | None = None,
                wire: str = "vllm") -> AsyncIterator[common_pb2.KvEventBatch]:
    """The deployment's batches from `start` (0: live from now on) until cancelled; raises
    PublisherRestarted once `epoch()` (the engine's incarnation) changes."""
    decode = decoder(wire)
    first = epoch() if epoch is not None else 0
    ctx = zmq.asyncio.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.subscribe(topic.encode())
    sub.connect(endpoint)
    event_id, last = 0, start - 1
    try:
        if start > 0 and replay_endpoint:
            for seq, payload in await replay(ctx, replay_endpoint, start):
                _contiguous(last, seq)
                batch = to_proto(decode(payload), seq, event_id)
                event_id += len(batch.events)
                last = seq
                yield batch
        while not cancelled():
            try:
                frames = await asyncio.wait_for(sub.recv_multipart(), 1.0)
            except TimeoutError:
                frames = []
            if epoch is not None and epoch() != first:
                raise PublisherRestarted(RESTARTED)
            if len(frames) < 3:
                continue
            seq = int.from_bytes(frames[1], "big")
            pending = [(seq, frames[2])]
            if last >= 0 and seq > last + 1 and replay_endpoint:  # a gap: refill it
                pending = [p for p in await replay(ctx, replay_endpoint, last + 1)
                           if p[0] < seq] + pending
            for s, payload in pending:
                if s <= last:
                    continue
                _contiguous(last, s)
                batch = to_proto(decode(payload), s, event_id)
                event_id += len(batch.events)
                last = s
                yield batch
    finally:
        with contextlib.suppress(zmq.ZMQError):
            sub.close(linger=0)


def _contiguous(last: int, seq: int) -> None:
    """HistoryLost unless `seq` follows `last` (-1: nothing relayed yet, any start)."""
    if last >= 0 and seq != last + 1:
        raise HistoryLost(f"KV event history lost: batches {last + 1}-{seq - 1} are no longer "
                          "in the publisher's replay buffer")


async def merge(streams: list[AsyncIterator[common_pb2.KvEventBatch]]
                ) -> AsyncIterator[common_pb2.KvEventBatch]:
    """Every rank's stream as one, in arrival order (each batch keeps its rank's own sequence
    number and carries the rank, as smg-grpc-servicer 0.14.1's relay sends them); the first
    stream to fail ends it with that failure."""
    if len(streams) == 1:
        async for batch in streams[0]:
            yield batch
        return
    queue: asyncio.Queue[common_pb2.KvEventBatch] = asyncio.Queue(maxsize=1024)

    async def pump(stream: AsyncIterator[common_pb2.KvEventBatch]) -> None:
        async for batch in stream:
            await queue.put(batch)

    pumps = {asyncio.create_task(pump(s)) for s in streams}
    get: asyncio.Task[common_pb2.KvEventBatch] | None = None
    try:
        while pumps or not queue.empty():
            get = asyncio.create_task(queue.get())
            done, _ = await asyncio.wait({get, *pumps}, return_when=asyncio.FIRST_COMPLETED)
            if get not in done:
                get.cancel()  # not taken: nothing is lost
            for task in done - {get}:
                pumps.discard(task)
                task.result()  # a failed rank's error ends the stream
            if get in done:
                yield get.result()
    finally:
        tasks = [*pumps, *([get] if get is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _place(msg, e: BlockStored | BlockRemoved) -> None:
    """Where the blocks live (medium, tier, KV-cache group), set only when the event says."""
    if e.medium is not None:
        msg.medium = e.medium
        msg.tier = TIER.get(e.medium, common_pb2.KV_CACHE_TIER_UNSPECIFIED)
    if e.group_idx is not None:
        msg.group_idx = e.group_idx
