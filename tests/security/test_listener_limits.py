"""The listeners' limits, over raw sockets and real clients: the HTTP header deadline against a
slowloris (scrapes and health checks keep answering; the slow connections are closed by the
server with 408), header size and count (431), methods (405 with Allow, for a method the route
does not take and for one httptools does not know), HTTP/0.9 (400 at once), keep-alive;
gRPC's message size (RESOURCE_EXHAUSTED) and concurrent streams per connection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
from fleets import fleet_doc
from ready import wait_ready
from server_proc import ServerProcess

from clients.client import AsyncClient, build_request
from doppelchip.v1 import inference_pb2 as pb
from doppelchip.v1 import inference_pb2_grpc as pb_grpc

HEADER_TIMEOUT_S = 2.0  # a scrape's connection must send its request within it: 1 s, on a
#                         machine running two suites at once, sometimes cut one off unanswered
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
        wait_ready(s.target)
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


SCRAPE_BOUND_S = 5.0  # generous: an unloaded scrape takes milliseconds


async def slow_client(server, stop: asyncio.Event, closed: list[bytes],
                      holding: asyncio.Event) -> None:
    """Open a connection and send a request's headers a byte at a time, for ever; when the
    server closes it, note what it said and open another, until `stop`. `holding` is set once
    the first connection has started its request."""
    request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 10_000
    while not stop.is_set():
        reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
        reply = asyncio.ensure_future(reader.read())
        try:
            for byte in request:
                writer.write(bytes([byte]))
                await writer.drain()
                holding.set()
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
    holding = [asyncio.Event() for _ in range(ATTACKERS)]
    attack = [asyncio.create_task(slow_client(server, stop, closed, h)) for h in holding]
    scrapes, slowest = 0, 0.0
    try:
        # every attacker holds a half-sent request before the scrapes start
        await asyncio.wait_for(asyncio.gather(*(h.wait() for h in holding)), 30)
        deadline = time.monotonic() + ATTACK_S
        # a fresh connection per request: a kept-alive one could be closed by the server's
        # 1 s keep-alive deadline just as the next request goes out on it (HTTP/1.1's own
        # race, which a loaded machine makes likely), and that is not what this test is about
        no_reuse = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.http_url, timeout=20,
                                     limits=no_reuse) as http:
            while time.monotonic() < deadline:
                started = time.monotonic()
                r = await http.get("/metrics")
                assert r.status_code == 200 and "vllm:num_requests_running" in r.text
                assert (await http.get("/health")).status_code == 200
                slowest = max(slowest, time.monotonic() - started)
                scrapes += 1
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*attack), 30)
    assert scrapes >= 3 and slowest < SCRAPE_BOUND_S, (scrapes, slowest)
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


async def test_an_unknown_method_is_405_with_allow(server):
    """httptools refuses a method it does not know before the app sees it (uvicorn alone
    answers a bare 400): the listener answers as the app does for a known method, 405 with the
    route's `Allow`, in vLLM's JSON shape; 404 where no route has the path."""
    for method, path, allow in (("FOO", "/metrics", {"GET", "HEAD"}),
                                ("BREW", "/v1/completions?x=1", {"POST"}),
                                ("FOO", "/health", {"GET"})):
        reply = await exchange(server, request([], method=method, path=path))
        assert status(reply) == 405, reply
        head, _, body = reply.partition(b"\r\n\r\n")
        allowed = next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                       if line.lower().startswith(b"allow:"))
        assert set(allowed.decode().replace(" ", "").split(",")) == allow
        assert json.loads(body)["error"]["code"] == 405
    reply = await exchange(server, request([], method="FOO", path="/no/such/route"))
    assert status(reply) == 404 and json.loads(reply.partition(b"\r\n\r\n")[2])


async def test_an_unknown_method_sent_a_byte_at_a_time(server):
    """The parser fails at the method's first wrong byte, before the path has come: the
    listener waits for the request line (within the header deadline), then answers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    try:
        for byte in b"FOO /metrics HTTP/1.1\r\n":  # the line only: the answer closes
            writer.write(bytes([byte]))
            await writer.drain()
        assert status(await asyncio.wait_for(reader.read(), 10)) == 405
    finally:
        writer.close()


async def test_an_unknown_method_after_a_kept_alive_request(server):
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert status(head) == 200
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        writer.write(b"FOO /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = await asyncio.wait_for(reader.read(), 10)
        assert status(reply) == 405 and b"allow: GET" in reply
    finally:
        writer.close()


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
    streaming = [asyncio.Event() for _ in range(MAX_STREAMS)]

    async def hold(accepted: asyncio.Event) -> None:
        call = client.stub.Generate(build_request("hold", deployment="slow", max_tokens=1000,
                                                  ignore_eos=True), timeout=30)
        try:
            await call.initial_metadata()  # the server has taken the stream
            accepted.set()
            async for _ in call:
                pass
        finally:
            call.cancel()

    holds = [asyncio.create_task(hold(e)) for e in streaming]
    try:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in streaming)), 20)
        assert not any(h.done() for h in holds)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await client.get_deployment("fast", timeout=1.0)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # a connection of its own (no shared subchannel) is not held up
        options = [("grpc.use_local_subchannel_pool", 1)]
        async with grpc.aio.insecure_channel(server.target, options=options) as channel:
            reply = await pb_grpc.InferenceStub(channel).GetDeployment(
                pb.GetDeploymentRequest(name="fast"), timeout=5)
            assert reply.name == "fast"
    finally:
        for h in holds:
            h.cancel()
        await asyncio.gather(*holds, return_exceptions=True)
    assert (await client.get_deployment("fast", timeout=5)).name == "fast"
