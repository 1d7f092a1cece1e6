"""The listeners' limits, over raw sockets and real clients: the HTTP header deadline against a
slowloris (scrapes and health checks keep answering; the slow connections are closed by the
server with 408), header size and count (431), methods (405 with Allow; a method httptools
does not know: 400), HTTP/0.9 (400 at once), keep-alive; gRPC's message size
(RESOURCE_EXHAUSTED) and concurrent streams per connection."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
from conftest import fleet_doc
from server_proc import ServerProcess

from clients.client import AsyncClient

HEADER_TIMEOUT_S = 1.0
KEEP_ALIVE_S = 1.0
MAX_HEADER_BYTES = 16384
MAX_HEADERS = 32
MAX_MESSAGE = 65536
MAX_STREAMS = 2


@pytest.fixture(scope="module")
def server():
    doc = fleet_doc({"http_header_timeout_s": HEADER_TIMEOUT_S,
                     "http_timeout_keep_alive_s": KEEP_ALIVE_S,
                     "h11_max_incomplete_event_size": MAX_HEADER_BYTES,
                     "h11_max_header_count": MAX_HEADERS,
                     "grpc_max_receive_message_length": MAX_MESSAGE,
                     "grpc_max_concurrent_streams": MAX_STREAMS})
    with ServerProcess(doc) as s:
        yield s


async def exchange(server, data: bytes, timeout: float = 10.0) -> bytes:
    """Send `data` on a fresh connection; everything the server sends until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


def status(reply: bytes) -> int:
    assert reply.startswith(b"HTTP/1.1 "), reply[:100]
    return int(reply.split(b" ", 2)[1])


# ---- slowloris ------------------------------------------------------------------------------
ATTACKERS = 300
ATTACK_S = 4.0
BYTE_EVERY_S = 0.25


async def slow_client(server, stop: asyncio.Event, closed: list[bytes]) -> None:
    """Open a connection and send a request's headers a byte at a time, for ever; when the
    server closes it, note what it said and open another, until `stop`."""
    request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 10_000
    while not stop.is_set():
        reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
        reply = asyncio.ensure_future(reader.read())
        try:
            for byte in request:
                writer.write(bytes([byte]))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(reply), BYTE_EVERY_S)
                if reply.done() or stop.is_set():
                    break
            if reply.done():
                closed.append(reply.result())
        except ConnectionError:
            closed.append(b"reset")
        finally:
            reply.cancel()
            writer.close()


async def test_a_slowloris_does_not_starve_scrapes_and_is_cut_off(server):
    stop, closed = asyncio.Event(), []
    attack = [asyncio.create_task(slow_client(server, stop, closed)) for _ in range(ATTACKERS)]
    scrapes = 0
    try:
        await asyncio.sleep(0.5)  # every attacker holds a half-sent request
        deadline = time.monotonic() + ATTACK_S
        async with httpx.AsyncClient(base_url=server.http_url, timeout=20) as http:
            while time.monotonic() < deadline:
                r = await http.get("/metrics", headers={"Connection": "close"})
                assert r.status_code == 200 and "vllm:num_requests_running" in r.text
                assert (await http.get("/health")).status_code == 200
                scrapes += 1
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*attack), 30)
    assert scrapes >= 3
    # The server cut the slow connections off at its header deadline: each attacker saw at
    # least one of its connections closed with 408 (a request trickling for ever otherwise).
    timed_out = [c for c in closed if c.startswith(b"HTTP/1.1 408")]
    assert len(timed_out) >= ATTACKERS, (len(closed), closed[:3])


async def test_a_silent_connection_is_closed_at_the_header_deadline(server):
    started = time.monotonic()
    assert await exchange(server, b"", timeout=HEADER_TIMEOUT_S + 10) == b""  # closed, no reply
    assert time.monotonic() - started >= HEADER_TIMEOUT_S * 0.9


async def test_an_idle_kept_alive_connection_is_closed(server):
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert status(head) == 200
        assert await asyncio.wait_for(reader.read(), KEEP_ALIVE_S + 10) == b""
    finally:
        writer.close()


# ---- header limits, methods, HTTP/0.9 ------------------------------------------------------
def request(headers: list[tuple[str, str]], method: str = "GET", path: str = "/health") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close",
             *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_header_count_and_size_limits(server):
    many = [(f"X-H{i}", "v") for i in range(MAX_HEADERS + 1)]
    reply = await exchange(server, request(many))
    assert status(reply) == 431 and b"request headers" in reply
    big = [("X-Big", "a" * MAX_HEADER_BYTES)]
    reply = await exchange(server, request(big))
    assert status(reply) == 431 and str(MAX_HEADER_BYTES).encode() in reply
    # just under both limits: served
    fine = [(f"X-H{i}", "v") for i in range(MAX_HEADERS - 3)] + [("X-Big", "a" * 8000)]
    assert status(await exchange(server, request(fine))) == 200


async def test_a_known_route_with_another_method_is_405_with_allow(server):
    async with httpx.AsyncClient(base_url=server.http_url, timeout=10) as http:
        r = await http.delete("/metrics")
        assert r.status_code == 405
        assert set(r.headers["allow"].replace(" ", "").split(",")) == {"GET", "HEAD"}
        assert r.json()["error"]["code"] == 405
        r = await http.get("/v1/completions")
        assert r.status_code == 405 and r.headers["allow"] == "POST"


async def test_an_unknown_method_is_400(server):
    """httptools (as in vLLM's stack) does not parse a method it does not know: 400."""
    for path in ("/metrics", "/v1/completions"):
        reply = await exchange(server, request([], method="FOO", path=path))
        assert status(reply) == 400


async def test_http_0_9_is_refused_at_once(server):
    started = time.monotonic()
    reply = await exchange(server, b"GET /metrics\r\n", timeout=HEADER_TIMEOUT_S / 2)
    assert status(reply) == 400 and b"HTTP/0.9" in reply
    assert time.monotonic() - started < HEADER_TIMEOUT_S


# ---- gRPC ----------------------------------------------------------------------------------
@pytest.fixture
async def client(server) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.target) as c:
        yield c


async def test_an_oversized_grpc_message_is_resource_exhausted(client):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        async for _ in client.generate("x" * (MAX_MESSAGE + 1), max_tokens=1, timeout=10):
            pass
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in e.value.details() and str(MAX_MESSAGE) in e.value.details()
    chunks = [c async for c in client.generate("x" * 200, max_tokens=1, timeout=10)]
    assert chunks[-1].HasField("final")  # under the limit: served


async def test_streams_per_connection(server, client):
    """With MAX_STREAMS calls open on a connection, a further call on it waits (the client
    queues it until a stream frees); another connection is served meanwhile."""
    async def hold() -> None:
        async for _ in client.generate("hold", deployment="slow", max_tokens=200,
                                       ignore_eos=True, timeout=30):
            pass

    holds = [asyncio.create_task(hold()) for _ in range(MAX_STREAMS)]
    try:
        await asyncio.sleep(0.5)  # both streams open
        assert not any(h.done() for h in holds)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await client.get_deployment("fast", timeout=1.0)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # a connection of its own (no shared subchannel) is not held up
        async with AsyncClient(server.target) as other:
            other.channel = grpc.aio.insecure_channel(
                server.target, options=[("grpc.use_local_subchannel_pool", 1)])
            other.stub = type(other.stub)(other.channel)
            assert (await other.get_deployment("fast", timeout=5)).name == "fast"
            await other.channel.close()
    finally:
        for h in holds:
            h.cancel()
        await asyncio.gather(*holds, return_exceptions=True)
    assert (await client.get_deployment("fast", timeout=5)).name == "fast"
