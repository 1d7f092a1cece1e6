"""vLLM's ZeroMQ KV-event publisher, in the engine-core process (the one writer of the cache).

Wire protocol, as vLLM 0.33.0's `ZmqEventPublisher` (`vllm/distributed/kv_events.py`):
- PUB socket (high-water mark `hwm`): one multipart message per batch, `[topic (UTF-8),
  sequence number (8 bytes big-endian, from 0, +1 per batch), msgpack KVEventBatch]`;
- optional ROUTER replay socket, bound at `replay_endpoint`, send high-water mark
  `2 * (buffer_steps + 1)`, keeping the last `buffer_steps` (seq, payload) pairs. A request is
  exactly `[identity, b"", start seq (8 bytes big-endian)]` (a REQ socket sending one frame);
  anything else is logged and ignored. The answer: `[identity, b"", topic, seq, payload]` for
  every buffered seq >= start, then `[identity, b"", b"", (-1 as 8 signed bytes), b""]`.

Why no publisher thread (vLLM has one): the engine loop already polls its sockets, so it
polls the replay socket too and sends each step's batch itself, non-blocking; past `hwm` a
slow subscriber loses batches (vLLM's PUB behaviour) and the replay buffer still has them.
vLLM's `max_queue_size` bounds the queue to its thread, which does not exist here: accepted,
unused.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import zmq

from server.engine.kv_events import KVCacheEvent, KVEventBatch, encode_batch
from server.engine.kv_events_config import Endpoint, KVEventsConfig, resolve
from server.kv_events import sglang_wire

log = logging.getLogger("doppelchip.engine")

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class KvEventPublisher:
    """One rank's PUB (+ replay ROUTER) sockets. ``endpoint`` / ``replay_endpoint`` are where
    subscribers go (the bound address, port 0 resolved), for DeploymentInfo and the docs."""

    def __init__(self, ctx: zmq.Context, cfg: KVEventsConfig, *, rank: int, offset: int,
                 exposed: bool = False, pinned: tuple[str, str] = ("", ""),
                 wire: str = "vllm") -> None:
        """`pinned`: on a restart, the (endpoint, replay endpoint) the previous incarnation
        bound; bound again exactly, so a configured port 0 does not move. `wire`: "vllm", or
        "sglang" for a pod that imitates SGLang (`sglang_wire.py`: its batches, and replay
        answers without the topic frame)."""
        self.rank, self.sglang = rank, wire == "sglang"
        self.topic = cfg.topic.encode("utf-8")
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=cfg.buffer_steps)
        self.next_seq = 0
        self.batches = self.events = self.dropped = 0
        where = resolve(cfg.endpoint, offset, exposed=exposed)
        if pinned[0] and where.bind:
            where = Endpoint(pinned[0], True)
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.set_hwm(cfg.hwm)
        if where.bind:
            self.pub.bind(where.url)
            self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self.pub.connect(where.url)
            self.endpoint = where.url
        self.replay: zmq.Socket | None = None
        self.replay_endpoint = ""
        if cfg.replay_endpoint is not None:
            self.replay = ctx.socket(zmq.ROUTER)
            self.replay.setsockopt(zmq.LINGER, 0)
            self.replay.setsockopt(zmq.SNDHWM, 2 * (cfg.buffer_steps + 1))
            self.replay.bind(pinned[1] or resolve(cfg.replay_endpoint, offset, replay=True,
                                                  exposed=exposed).url)
            self.replay_endpoint = self.replay.getsockopt_string(zmq.LAST_ENDPOINT)
        log.info("KV events: publishing on %s (%s)%s", self.endpoint,
                 "bound" if where.bind else "connected",
                 f", replay on {self.replay_endpoint}" if self.replay else "")

    def publish(self, events: list[KVCacheEvent]) -> None:
        """One batch: the events of one engine step, in the order the cache changed."""
        seq = self.next_seq
        self.next_seq += 1
        payload = (sglang_wire.encode(events, self.rank) if self.sglang else
                   encode_batch(KVEventBatch(ts=time.time(), events=events,
                                             data_parallel_rank=self.rank)))
        try:
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload), zmq.NOBLOCK)
        except zmq.Again:  # past the high-water mark: this subscriber misses it (replayable)
            self.dropped += 1
        self.buffer.append((seq, payload))
        self.batches += 1
        self.events += len(events)

    def service_replay(self) -> None:
        """Answer every replay request waiting on the ROUTER socket."""
        sock = self.replay
        if sock is None:
            return
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3:
                log.warning("KV events: invalid replay request of %d frames", len(frames))
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            # from the newest back: a poller that keeps up asks for the last few batches only
            # (TensorRT-LLM's router polls after every request), so this costs what it sends
            wanted = []
            for batch in reversed(self.buffer):
                if batch[0] < first:
                    break
                wanted.append(batch)
            topic = () if self.sglang else (self.topic,)
            for seq, payload in reversed(wanted):
                sock.send_multipart((client, b"", *topic, seq.to_bytes(8, "big"), payload))
            sock.send_multipart((client, b"", *(b"" for _ in topic), END_SEQ, b""))

    def close(self) -> None:
        self.pub.close(linger=0)
        if self.replay is not None:
            self.replay.close(linger=0)
