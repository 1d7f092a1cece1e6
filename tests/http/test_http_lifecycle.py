"""Client disconnects free their blocks; drain answers 503 while in-flight streams finish;
several front ends share the HTTP port and show one consistent /metrics; gRPC n > 1."""

from __future__ import annotations

import asyncio
import signal
import socket

import httpx
import pytest
from fleets import TEST_FLEET, assert_released, fleet_doc
from http_helpers import first_data
from server_proc import ServerProcess, metric

from clients.client import AsyncClient

SLOW = {"model": "llama-3.1-70b", "max_tokens": 2000, "ignore_eos": True}


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "leave early", "stream": True, **SLOW}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "leave"}],
                              "stream": True, "n": 2, **SLOW}),
    # (no ignore_eos in these two APIs: the seeded answer to this prompt is long enough)
    ("/v1/messages", {"model": "llama-3.1-70b", "max_tokens": 2000, "stream": True,
                      "messages": [{"role": "user", "content": "leave"}]}),
    ("/v1/responses", {"model": "llama-3.1-70b", "max_output_tokens": 2000, "stream": True,
                       "input": "leave"}),
])
async def test_stream_disconnect_frees_blocks(server, client, path, body):
    rid = f"gone-{path.rsplit('/', 1)[-1]}"
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as h:
        r = await h.send(h.build_request("POST", path, json=body,
                                         headers={"X-Request-Id": rid}), stream=True)
        lines = r.aiter_lines()  # kept: a dropped iterator would close the response
        await first_data(lines)
        await until_running(client)
        status = await client.get_deployment("slow")
        assert status.capacity.kv_blocks_free < status.capacity.kv_blocks_total
        await r.aclose()
    server.wait_for_log(rf"request_id=\S*{rid}-[0-9a-f]{{8}}\] finished on slow: abort",
                        timeout=10)
    await assert_released(client, "slow")


async def test_non_streaming_disconnect_frees_blocks(server, client):
    with socket.create_connection(("127.0.0.1", server.http_port)) as s:
        body = (b'{"prompt": "wait for it", "model": "llama-3.1-70b", "max_tokens": 2000, '
                b'"ignore_eos": true}')
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: nowait\r\n"
                  b"Content-Type: application/json\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        await until_running(client)
    server.wait_for_log(r"request_id=cmpl-nowait-[0-9a-f]{8}\] finished on slow: abort",
                        timeout=10)
    await assert_released(client, "slow")


async def until_running(client) -> None:
    for _ in range(500):
        if (await client.get_deployment("slow")).load.num_running:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the request never ran")


async def test_grpc_n_sequences_one_after_the_other(client):
    prompt = "three at once " * 12  # a few full KV blocks, which the sequences share
    chunks = [c async for c in client.generate(prompt, max_tokens=8, n=3, ignore_eos=True,
                                               seed=4)]
    finals = [i for i, c in enumerate(chunks) if c.HasField("final")]
    assert len(finals) == 3 and finals[-1] == len(chunks) - 1
    seqs, start = [], 0
    for end in finals:
        part = chunks[start:end + 1]
        assert part[0].index == 0  # each sequence starts at output position 0
        seqs.append([t for c in part for t in c.token_ids])
        start = end + 1
    assert all(len(s) == 8 for s in seqs) and len({tuple(s) for s in seqs}) == 3
    cached = [chunks[i].final.usage.cached_prompt_tokens for i in finals]
    assert cached[0] == 0 and min(cached[1:]) >= 16  # the prompt's blocks, computed once
    one = [t async for c in client.generate(prompt, max_tokens=8, ignore_eos=True, seed=4)
           for t in c.token_ids]
    assert seqs[0] == one  # sequence 0 is the request itself (seed + 0)
    await assert_released(client, "fast")


async def test_drain_answers_503_and_lets_streams_finish():
    with ServerProcess(TEST_FLEET) as server:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as h:
            r = await h.send(h.build_request("POST", "/v1/completions", json={
                "prompt": "finish me", "model": "llama-3.1-70b", "max_tokens": 40,
                "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}), stream=True)
            lines = r.aiter_lines()
            await first_data(lines)
            start = len(server.lines)
            server.signal(signal.SIGTERM)
            server.wait_for_log(r"draining: \d+ requests in flight", start=start)
            assert (await h.get("/health")).status_code == 503
            late = await h.post("/v1/completions", json={"prompt": "too late"})
            assert late.status_code == 503 and late.json()["error"]["code"] == 503
            rest = [line async for line in lines if line.startswith("data: ")]
            assert rest[-1] == "data: [DONE]"
            assert '"finish_reason":"length"' in "".join(rest)
            assert '"completion_tokens":40' in rest[-2]
        assert server.stop() == 0


async def test_front_ends_share_the_port_and_one_metrics_view():
    doc = fleet_doc({"api_server_count": 2})
    with ServerProcess(doc) as server:
        assert "with 2 front end(s)" in server.log
        n = 24
        for i in range(n):  # a new connection each: the kernel spreads them over front ends
            async with httpx.AsyncClient(base_url=server.http_url) as h:
                r = await h.post("/v1/completions", json={"prompt": f"spread {i}",
                                                          "max_tokens": 2})
                assert r.status_code == 200
        counts = set()
        for _ in range(8):  # whichever front end answers, it counts every front end's requests
            async with httpx.AsyncClient(base_url=server.http_url) as h:
                text = (await h.get("/metrics")).text
            counts.add(metric(text, "http_requests_total", handler="/v1/completions",
                              method="POST", status="2xx"))
        assert counts == {n}
        async with AsyncClient(server.target) as c:
            assert (await c.list_deployments()).metrics_port == server.http_port


def test_http_port_in_use_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = ServerProcess(TEST_FLEET, "--port", "0", "--http-port", str(port))
        with pytest.raises(AssertionError, match="exited before"):
            server.start(timeout=30)
        assert f"HTTP port 127.0.0.1:{port} is already in use" in server.log
        server.stop()


COLD = {"name": "cold", "model": "llama-3.1-8b", "quant": "fp8", "chip": "h100-sxm",
        "engine": "tensorrt-llm", "built_for": "hopper", "start": "cold", "max_model_len": 512}


async def test_not_ready_is_503():
    with ServerProcess(fleet_doc(deployments=[COLD])) as server:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as h:
            assert (await h.get("/health")).status_code == 503  # its one deployment compiles
            r = await h.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert r.status_code == 503 and "compiling" in r.json()["error"]["message"]
            assert r.json()["error"]["type"] == "Service Unavailable"
