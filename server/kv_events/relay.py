"""`VllmEngine.SubscribeKvEvents`: the engine's ZeroMQ stream relayed as gRPC, for smg.

Why a relay and not a second stream: the engine core publishes once (`publisher.py`); the
front end subscribes to that PUB socket like any subscriber. Each rank's batches are read in
sequence (`rank_batches`), every rank's merged into one stream (`merge`), and each batch
converted by smg's own code — smg-grpc-servicer 0.14.1's `kv_relay.decode_batch` and
`Normalizer`, the relay a vLLM 0.33.0 pod's smg servicer runs — so a gateway sees exactly
what it would see from such a pod: each batch under its rank's own sequence number with its
`dp_rank`, stores with their tier, locality, session, LoRA name and cache salt (the salt read
back from the first block's extra keys, inherited by children), per-block extra keys and
cache levels, event ids counted across the stream, placeholder stores dropped.

Beyond smg's relay (which streams live events only and refuses a resumption): a
`start_sequence_number` > 0 is served, on each rank, from the publisher's replay socket when
the deployment has one (vLLM's replay protocol), and a gap in the live stream is refilled
from it the same way; what the buffer no longer holds ends the stream with `HistoryLost`
(DATA_LOSS), as smg's relay ends it. Without a replay socket the stream is live only, and any
gap ends it. When the engine restarts (its epoch changes), its publisher counts from 0 again
on the same endpoints: the relay ends with `PublisherRestarted`, which the servicer answers
DATA_LOSS, as smg's servicer ends its live subscribers then; a subscriber subscribes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable

import zmq
import zmq.asyncio
from smg_grpc_proto.generated import common_pb2
from smg_grpc_servicer import kv_relay as smg
from smg_grpc_servicer.load_record import LoadRecorder, LoadSource

from server.engine.kv_events import KVEventBatch, decode_batch
from server.kv_events import sglang_wire
from server.kv_events.publisher import END_SEQ

log = logging.getLogger("doppelchip.kv_events")

DISABLED = ("KV cache events not enabled. Start vLLM with --kv-events-config "
            '\'{"enable_kv_cache_events": true, "publisher": "zmq"}\'')  # smg servicer's words
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


def normalizer() -> smg.Normalizer:
    """One stream's converter, as smg's relay makes it (`SMG_KV_EVENT_HASH_CHECK`: engine-hash
    verification, counted and logged when the stream ends)."""
    return smg.Normalizer(os.environ.get(smg.HASH_CHECK_ENV))


def to_proto(norm: smg.Normalizer, rank: int, seq: int, payload: bytes
             ) -> common_pb2.KvEventBatch:
    """One rank's batch as smg relays it (a payload that does not decode: an empty batch
    under its sequence, so the gateway sees no gap)."""
    try:
        batch = smg.decode_batch(payload)
    except Exception as e:  # one bad payload must not end the stream
        log.warning("KV events: batch %d of rank %d does not decode; relayed empty: %s",
                    seq, rank, e)
        return common_pb2.KvEventBatch(sequence_number=seq, dp_rank=rank)
    return norm.normalize_batch(batch, seq, rank)


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


async def rank_batches(endpoint: str, replay_endpoint: str, topic: str, start: int,
                       cancelled: Callable[[], bool], epoch: Callable[[], int] | None = None
                       ) -> AsyncIterator[tuple[int, bytes]]:
    """One rank's (sequence, payload) batches from `start` (0: live from now on), each
    following the last, until cancelled; raises PublisherRestarted once `epoch()` (the
    engine's incarnation) changes, HistoryLost for a gap the replay buffer cannot fill."""
    first = epoch() if epoch is not None else 0
    ctx = zmq.asyncio.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.subscribe(topic.encode())
    sub.connect(endpoint)
    last = start - 1
    try:
        if start > 0 and replay_endpoint:
            for seq, payload in await replay(ctx, replay_endpoint, start):
                _contiguous(last, seq)
                last = seq
                yield seq, payload
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
                last = s
                yield s, payload
    finally:
        with contextlib.suppress(zmq.ZMQError):
            sub.close(linger=0)


def _contiguous(last: int, seq: int) -> None:
    """HistoryLost unless `seq` follows `last` (-1: nothing relayed yet, any start)."""
    if last >= 0 and seq != last + 1:
        raise HistoryLost(f"KV event history lost: batches {last + 1}-{seq - 1} are no longer "
                          "in the publisher's replay buffer")


async def merge(streams: dict[int, AsyncIterator[tuple[int, bytes]]],
                load_source: LoadSource | None = None
                ) -> AsyncIterator[common_pb2.KvEventBatch]:
    """Every rank's stream (rank -> its `rank_batches`) as one, in arrival order, each batch
    converted by one smg `Normalizer` (`to_proto`) under its rank's own sequence number and
    with its rank, as smg-grpc-servicer 0.14.1's relay sends them; the first stream to fail
    ends it with that failure. With `load_source` (the servicer's `GetLoads` figures of a
    rank, as smg's `EngineLoad`), smg's `LoadRecorder` stamps each batch with its rank's load
    and sends `load_only` batches while no batch flows (when the load moved, or as a
    heartbeat), as smg's relay does."""
    norm = normalizer()
    recorder = LoadRecorder.optional(load_source)
    tick = recorder.poll_timeout(1.0) if recorder is not None else None
    queue: asyncio.Queue[tuple[int, int, bytes]] = asyncio.Queue(maxsize=1024)

    async def pump(rank: int, stream: AsyncIterator[tuple[int, bytes]]) -> None:
        async for seq, payload in stream:
            await queue.put((rank, seq, payload))

    pumps = {asyncio.create_task(pump(r, s)) for r, s in streams.items()}
    get: asyncio.Task[tuple[int, int, bytes]] | None = None
    try:
        while pumps or not queue.empty():
            get = asyncio.create_task(queue.get())
            done, _ = await asyncio.wait({get, *pumps}, timeout=tick,
                                         return_when=asyncio.FIRST_COMPLETED)
            if get not in done:
                get.cancel()  # not taken: nothing is lost
            for task in done - {get}:
                pumps.discard(task)
                task.result()  # a failed rank's error ends the stream
            if get in done:
                batch = to_proto(norm, *get.result())
                yield recorder.stamp(batch) if recorder is not None else batch
            elif recorder is not None and (beat := recorder.heartbeat()) is not None:
                yield beat
    finally:
        tasks = [*pumps, *([get] if get is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if norm.hash_check is not None:
            log.info("KV events relayed: %s", norm.counts)
