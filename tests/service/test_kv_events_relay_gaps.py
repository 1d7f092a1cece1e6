"""The gRPC relay's rank streams (`server.kv_events.relay.rank_batches`) against a stand-in
publisher speaking vLLM's ZeroMQ protocol (a PUB socket and a replay ROUTER, written here
with pyzmq): a resumption is served from the replay buffer; a gap in the live stream is
refilled from it; and when the buffer no longer holds what is missing — a subscriber's index
would silently diverge — the stream ends with `HistoryLost` (DATA_LOSS on the wire, smg's
answer), as it does when a resumption starts before the buffer's oldest batch."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import zmq
import zmq.asyncio

from server.engine.kv_events import BlockStored, KVEventBatch, encode_batch
from server.kv_events.relay import HistoryLost, rank_batches

END = (-1).to_bytes(8, "big", signed=True)


def payload(seq: int) -> bytes:
    return encode_batch(KVEventBatch(ts=float(seq), data_parallel_rank=0, events=[
        BlockStored(block_hashes=[seq], parent_block_hash=None, token_ids=[seq] * 4,
                    block_size=4, lora_id=None, medium="GPU", lora_name=None)]))


class Publisher:
    """A PUB socket and a replay ROUTER holding `buffer` (seq -> payload)."""

    def __init__(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind("tcp://127.0.0.1:0")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind("tcp://127.0.0.1:0")
        self.buffer: dict[int, bytes] = {}
        self.serving = asyncio.create_task(self._serve())

    @property
    def endpoints(self) -> tuple[str, str]:
        return (self.pub.getsockopt_string(zmq.LAST_ENDPOINT),
                self.router.getsockopt_string(zmq.LAST_ENDPOINT))

    async def _serve(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            for seq in sorted(s for s in self.buffer if s >= int.from_bytes(start, "big")):
                await self.router.send_multipart((client, b"", b"kv", seq.to_bytes(8, "big"),
                                                  self.buffer[seq]))
            await self.router.send_multipart((client, b"", b"", END, b""))

    async def live(self, seq: int) -> None:
        await self.pub.send_multipart((b"kv", seq.to_bytes(8, "big"), self.buffer[seq]))

    async def close(self) -> None:
        self.serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.serving
        self.ctx.destroy(linger=0)


async def until_raised(stream, pub: Publisher, seq: int) -> list[int]:
    """Read `stream` while batch `seq` is published live (again and again: a SUB socket that
    has not joined yet misses what is sent before) until the stream ends; what it relayed."""
    got: list[int] = []

    async def read() -> None:
        async for seq, _ in stream:
            got.append(seq)

    reader = asyncio.create_task(read())
    deadline = time.monotonic() + 20
    try:
        while not reader.done():
            assert time.monotonic() < deadline, f"the relay never ended: {got}"
            await pub.live(seq)
            await asyncio.wait([reader], timeout=0.05)
        reader.result()
    finally:
        reader.cancel()
    return got


async def test_a_gap_the_buffer_still_holds_is_refilled_then_a_lost_one_ends_the_stream():
    pub = Publisher()
    try:
        pub.buffer = {s: payload(s) for s in range(0, 4)}
        stream = rank_batches(*pub.endpoints, "kv", 1, lambda: False)
        first = [(await anext(stream))[0] for _ in range(3)]
        assert first == [1, 2, 3]  # the resumption, from the replay buffer
        pub.buffer.update({5: payload(5), 6: payload(6)})  # 4 missed live; still buffered...
        pub.buffer[4] = payload(4)
        got: list[int] = []

        async def read_two() -> None:
            async for seq, _ in stream:
                got.append(seq)
                if len(got) == 2:
                    return

        reader = asyncio.create_task(read_two())
        while not reader.done():  # live 5 arrives: 4 is refilled from the buffer first
            await pub.live(5)
            await asyncio.wait([reader], timeout=0.05)
        assert got == [4, 5]
        for s in (6, 7, 8):  # 6 and 7 fall out of the buffer before the relay sees 8
            pub.buffer.pop(s, None)
        pub.buffer[8] = payload(8)
        with pytest.raises(HistoryLost, match="batches 6-7"):
            await until_raised(stream, pub, 8)
    finally:
        await pub.close()


async def test_a_resumption_older_than_the_buffer_is_history_lost():
    pub = Publisher()
    try:
        pub.buffer = {s: payload(s) for s in range(10, 13)}
        with pytest.raises(HistoryLost, match="batches 3-9"):
            async for _ in rank_batches(*pub.endpoints, "kv", 3, lambda: False):
                pass
    finally:
        await pub.close()
