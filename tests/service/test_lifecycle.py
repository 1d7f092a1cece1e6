"""Cancellation, deadlines, health, drain, reflection, deployments and metrics."""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter

import grpc
import pytest
from fleets import TEST_FLEET, assert_released, fleet_doc, sigterm_mid_stream
from grpc_health.v1 import health_pb2
from server_proc import ServerProcess

from clients.client import AsyncClient, Client, build_request
from doppelchip.v1 import inference_pb2 as pb
from server.engine.tokenizer import get_tokenizer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def test_client_cancel_mid_stream_aborts_in_engine(client, server):
    call = client.stub.Generate(build_request(
        "cancel me", deployment="slow", max_tokens=2000, ignore_eos=True, request_id="cancel-1"))
    first = await call.read()
    status = await client.get_deployment("slow")
    assert first.token_ids and status.capacity.kv_blocks_free < status.capacity.kv_blocks_total
    call.cancel()
    server.wait_for_log(r"\[request_id=cancel-1\] finished on slow: abort", timeout=10)
    await assert_released(client, "slow")


async def test_deadline_aborts_in_engine(client, server):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in client.generate("too slow", deployment="slow", max_tokens=2000,
                                       ignore_eos=True, request_id="deadline-1", timeout=0.3):
            pass
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    server.wait_for_log(r"\[request_id=deadline-1\] finished on slow: abort", timeout=10)
    await assert_released(client, "slow")


async def test_health_serving_then_not_serving_on_drain():
    with ServerProcess(TEST_FLEET) as server:
        async with AsyncClient(server.target) as c:
            assert await c.health() == SERVING
            assert await c.health("doppelchip.v1.Inference") == SERVING
            watch = c.health_stub.Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == SERVING
            # an in-flight stream (40 emulated steps of 0.4 s = 0.8 s of wall time)
            inflight = c.stub.Generate(build_request(
                "drain", deployment="slow", max_tokens=40, ignore_eos=True,
                request_id="inflight"))
            await inflight.initial_metadata()
            server.signal(signal.SIGTERM)
            assert (await watch.read()).status == NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in c.generate("late", max_tokens=2):
                    pass
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "draining" in err.value.details()
            chunks = [chunk async for chunk in inflight]
            assert chunks[-1].final.finish_reason == pb.FINISH_REASON_LENGTH
            assert sum(len(ch.token_ids) for ch in chunks) == 40
            watch.cancel()
        assert await asyncio.to_thread(server.stop) == 0


async def test_drain_grace_expiry_aborts_what_is_left():
    doc = {**TEST_FLEET, "server": {**TEST_FLEET["server"], "drain_grace_s": 0.05}}
    with ServerProcess(doc) as server:
        rest = await sigterm_mid_stream(server, deployment="slow")
        assert rest[-1].final.finish_reason == pb.FINISH_REASON_ABORT
        assert await asyncio.to_thread(server.stop) == 0
        assert "grace expired: aborting 1 requests" in server.log


async def test_reflection_lists_services(server):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    def services() -> tuple[list[str], list[str]]:
        with grpc.insecure_channel(server.target) as channel:
            db = ProtoReflectionDescriptorDatabase(channel)
            names = list(db.get_services())
            desc = db.FindFileContainingSymbol("doppelchip.v1.Inference")
            return names, [m.name for m in desc.service[0].method]

    names, methods = await asyncio.to_thread(services)
    assert {"doppelchip.v1.Inference", "grpc.health.v1.Health"} <= set(names)
    assert methods == ["Generate", "ListDeployments", "GetDeployment"]


async def test_list_and_get_deployments(client):
    listing = await client.list_deployments()
    assert [d.name for d in listing.deployments] == ["fast", "slow"]
    assert listing.default_deployment == "fast"
    assert listing.time_scale == 0.05
    fast = listing.deployments[0]
    assert fast.is_default and fast.state == pb.DEPLOYMENT_STATE_READY
    cap = fast.capacity
    # vLLM 0.33.0 on a GPU of >= 70 GiB: 1,024 sequences (engines.toml)
    assert cap.block_size == 16 and cap.max_model_len == 256 and cap.max_num_seqs == 1024
    assert cap.kv_blocks_total > 10_000  # an 8B model leaves most of an H100's 80 GB to KV
    assert cap.max_concurrency == min(1024, cap.kv_blocks_total // (256 // 16))
    assert fast.device.count == 1
    slow = await client.get_deployment("slow")
    assert (slow.model, slow.device.chip, slow.engine) == ("llama-3.1-70b", "rtx-4090",
                                                           "llama.cpp")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.get_deployment("nope")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_metrics_endpoint():
    with ServerProcess(TEST_FLEET) as server:  # a fresh server: counters from zero
        async with AsyncClient(server.target) as client:
            [c async for c in client.generate("count me", max_tokens=5, ignore_eos=True)]
        text = await asyncio.to_thread(server.scrape)
    labels = 'deployment="fast",engine="0",model_name="llama-3.1-8b"'
    assert f"vllm:num_requests_running{{{labels}}} 0.0" in text
    assert f"vllm:generation_tokens_total{{{labels}}} 5.0" in text
    prompt = len(get_tokenizer().encode("count me"))
    assert f"vllm:prompt_tokens_total{{{labels}}} {float(prompt)}" in text
    success = 'deployment="fast",engine="0",finished_reason="length",model_name="llama-3.1-8b"'
    assert f"vllm:request_success_total{{{success}}} 1.0" in text


async def test_sync_client(server):
    def run() -> tuple[list[pb.GenerateResponse], int]:
        with Client(server.target) as c:
            return list(c.generate("sync", max_tokens=4, ignore_eos=True)), c.health()

    chunks, health = await asyncio.to_thread(run)
    assert chunks[-1].final.usage.completion_tokens == 4 and health == SERVING


def test_build_request_rejects_unknown_option():
    with pytest.raises(TypeError, match="max_tokenz"):
        build_request("x", max_tokenz=3)


async def test_sigterm_under_load_ends_every_accepted_stream_with_a_final():
    """SIGTERM with 160 streams in flight over two front ends (gRPC Inference, VllmEngine and
    HTTP SSE) and a grace shorter than most need: every accepted stream gets its final chunk
    (finish reason length if it made it, else abort), none ends CANCELLED; calls on an open
    connection meanwhile get UNAVAILABLE, never DEADLINE_EXCEEDED; the server exits 0."""
    import httpx
    from smg_grpc_proto import vllm_engine_pb2 as vpb
    from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc

    load = {"name": "load", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
            "engine": "vllm", "max_model_len": 4096}
    doc = fleet_doc({"drain_grace_s": 0.3, "api_server_count": 2}, [load])
    lengths = [20 + 25 * i for i in range(160)]  # the short ones finish within the grace
    with ServerProcess(doc) as server:
        async with AsyncClient(server.target) as c, \
                httpx.AsyncClient(base_url=server.http_url, timeout=30,
                                  limits=httpx.Limits(max_connections=40)) as http:
            vllm = vpb_grpc.VllmEngineStub(c.channel)
            accepted = asyncio.Semaphore(0)

            async def inference(n: int) -> str:
                call = c.stub.Generate(build_request("load", max_tokens=n, ignore_eos=True))
                await call.initial_metadata()
                accepted.release()
                last = [m async for m in call][-1]
                return pb.FinishReason.Name(last.final.finish_reason)

            async def vllm_engine(n: int) -> str:
                call = vllm.Generate(vpb.GenerateRequest(
                    tokenized=vpb.TokenizedInput(input_ids=[1, 2]), stream=True,
                    sampling_params=vpb.SamplingParams(max_tokens=n, ignore_eos=True)))
                await call.initial_metadata()
                accepted.release()
                return [m async for m in call][-1].complete.finish_reason

            async def sse(n: int) -> str:
                body = {"prompt": "load", "max_tokens": n, "ignore_eos": True, "stream": True}
                async with http.stream("POST", "/v1/completions", json=body) as r:
                    assert r.status_code == 200
                    accepted.release()
                    events = [line async for line in r.aiter_lines()
                              if line.startswith("data: ")]
                assert events[-1] == "data: [DONE]"
                return json.loads(events[-2][6:])["choices"][0]["finish_reason"]

            kinds = [inference] * 100 + [vllm_engine] * 30 + [sse] * 30
            tasks = [asyncio.create_task(k(n)) for k, n in zip(kinds, lengths, strict=True)]
            for _ in tasks:
                await asyncio.wait_for(accepted.acquire(), 30)
            server.signal(signal.SIGTERM)
            late = []
            while len(late) < 100 and (not late or late[-1] != grpc.StatusCode.UNAVAILABLE):
                try:
                    [m async for m in c.generate("late", max_tokens=2, timeout=5)]
                    late.append(grpc.StatusCode.OK)
                except grpc.aio.AioRpcError as e:
                    late.append(e.code())
            ends = await asyncio.gather(*tasks, return_exceptions=True)
        assert await asyncio.to_thread(server.stop) == 0
    assert set(late) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, late
    finals = Counter(e if isinstance(e, str) else repr(e) for e in ends)
    assert set(finals) <= {"length", "abort", "FINISH_REASON_LENGTH", "FINISH_REASON_ABORT"}, \
        finals
    assert finals["abort"] + finals["FINISH_REASON_ABORT"] > 0, finals  # the grace did expire
    assert "grace expired" in server.log
