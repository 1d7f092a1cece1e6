"""The vllm.grpc.engine.VllmEngine service over real gRPC, without the gateway: every RPC smg
relies on, the status codes it maps to HTTP, and the KV pool after Abort."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import zipfile
from collections.abc import AsyncIterator

import grpc
import pytest
from fleets import assert_released, fleet_doc, make_fleet
from grpc_health.v1 import health_pb2, health_pb2_grpc
from server_proc import ServerProcess, read_rest, until
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc
from smg_grpc_proto.generated import common_pb2
from tokenizers import Tokenizer as HFTokenizer

from clients.client import AsyncClient
from server.config import ConfigError
from server.engine.tokenizer import get_tokenizer
from server.http.state import VLLM_VERSION
from server.vllm_servicer import SERVICE_NAME

TOK = get_tokenizer()
LONG = ("The quick brown fox jumps over the lazy dog and then runs far away into the dark "
        "forest where nobody can find it again for many years to come")


@pytest.fixture
async def stub(server) -> AsyncIterator[vpb_grpc.VllmEngineStub]:
    async with grpc.aio.insecure_channel(server.target) as channel:
        yield vpb_grpc.VllmEngineStub(channel)


@pytest.fixture(scope="module")
def slow_server():
    """A server whose VllmEngine fronts `slow`: one sequence at a time, two waiting at most."""
    with ServerProcess(fleet_doc({"vllm_engine_deployment": "slow"})) as s:
        yield s


@pytest.fixture
async def slow(slow_server) -> AsyncIterator[tuple[ServerProcess, vpb_grpc.VllmEngineStub,
                                                    AsyncClient]]:
    async with grpc.aio.insecure_channel(slow_server.target) as channel, \
            AsyncClient(slow_server.target) as client:
        yield slow_server, vpb_grpc.VllmEngineStub(channel), client


def gen(ids, rid: str = "", stream: bool = True, **sampling) -> vpb.GenerateRequest:
    return vpb.GenerateRequest(
        request_id=rid, tokenized=vpb.TokenizedInput(input_ids=ids),
        sampling_params=vpb.SamplingParams(**sampling), stream=stream,
    )


async def responses(stub, request) -> list[vpb.GenerateResponse]:
    return [r async for r in stub.Generate(request)]


async def test_streaming_generate_chunks_then_complete(stub):
    ids = TOK.encode("hello world")
    call = stub.Generate(gen(ids, rid="v-1", max_tokens=12, ignore_eos=True))
    assert ("x-request-id", "v-1") in tuple(await call.initial_metadata())
    msgs = [r async for r in call]
    kinds = [m.WhichOneof("response") for m in msgs]
    assert kinds[-1] == "complete" and set(kinds[:-1]) == {"chunk"}
    chunks = [m.chunk for m in msgs[:-1]]
    assert sum(c.completion_tokens for c in chunks) == 12
    assert sum(len(c.token_ids) for c in chunks) == 12
    assert all(c.prompt_tokens == len(ids) for c in chunks)
    done = msgs[-1].complete
    assert done.finish_reason == "length" and done.prompt_tokens == len(ids)
    assert list(done.output_ids) == list(chunks[-1].token_ids)  # the last delta, as vLLM sends


async def test_non_streaming_generate_is_one_complete(stub):
    ids = TOK.encode("hello world")
    streamed = await responses(stub, gen(ids, max_tokens=10, ignore_eos=True, seed=3))
    msgs = await responses(stub, gen(ids, stream=False, max_tokens=10, ignore_eos=True, seed=3))
    assert [m.WhichOneof("response") for m in msgs] == ["complete"]
    done = msgs[0].complete
    assert done.completion_tokens == 10 and done.finish_reason == "length"
    assert list(done.output_ids) == [t for m in streamed[:-1] for t in m.chunk.token_ids]
    # prompt given as text works too
    text = await responses(stub, vpb.GenerateRequest(
        text="hello world", stream=False, sampling_params=vpb.SamplingParams(max_tokens=2)))
    assert text[0].complete.prompt_tokens == len(ids)


async def test_prefix_cache_hits_are_reported_as_cached_tokens(stub, client):
    ids = TOK.encode(f"{LONG} {LONG}")
    assert len(ids) >= 32
    first = (await responses(stub, gen(ids, stream=False, max_tokens=2)))[0].complete
    again = await responses(stub, gen(ids, max_tokens=2))
    assert first.cached_tokens == 0
    block = (await client.get_deployment("fast")).capacity.block_size
    assert again[-1].complete.cached_tokens == (len(ids) - 1) // block * block > 0


async def test_stop_string_is_enforced_in_the_worker(stub):
    ids = TOK.encode("hello world")
    full = (await responses(stub, gen(ids, stream=False, max_tokens=16, ignore_eos=True,
                                      seed=7)))[0].complete
    out = list(full.output_ids)
    stop = TOK.decode(out[5:6]).strip() or TOK.decode(out[5:7])
    assert stop and stop not in TOK.decode(out[:5])
    stopped = (await responses(stub, gen(ids, stream=False, max_tokens=16, ignore_eos=True,
                                         seed=7, stop=[stop])))[0].complete
    assert stopped.finish_reason == "stop" and stopped.matched_stop_str == stop
    assert stopped.completion_tokens < 16


async def test_invalid_requests_are_invalid_argument(stub):
    ids = TOK.encode("hello")
    bad = [
        vpb.GenerateRequest(sampling_params=vpb.SamplingParams(max_tokens=2)),  # no input
        gen([], max_tokens=2),
        gen(ids, max_tokens=2, n=129),
        gen(ids, max_tokens=2, logprobs=21),  # past --max-logprobs (20)
        gen(ids, max_tokens=2, prompt_logprobs=21),
        gen(ids, max_tokens=2, logprobs=-2),
        gen(ids, max_tokens=1000),  # beyond the 256-token context
        gen(ids, max_tokens=2, temperature=-1.0),
        gen([TOK.vocab_size + 5], max_tokens=2),
    ]
    for request in bad:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await responses(stub, request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, request


async def test_health_model_info_and_server_info(stub, server):
    health = await stub.HealthCheck(vpb.HealthCheckRequest())
    assert health.healthy and "ready" in health.message
    info = await stub.GetModelInfo(vpb.GetModelInfoRequest())
    assert info.served_model_name == "llama-3.1-8b" and info.is_generation
    assert info.max_context_length == 256 and info.vocab_size == TOK.vocab_size
    assert list(info.eos_token_ids) == [TOK.eos_token_id]
    assert info.bos_token_id == TOK.bos_token_id
    info = await stub.GetServerInfo(vpb.GetServerInfoRequest())
    assert info.server_type == "vllm-grpc" and info.data_parallel_size == 1
    assert info.block_size == 16 and info.active_requests == 0
    async with grpc.aio.insecure_channel(server.target) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        for _ in range(100):
            reply = await check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                break
            await asyncio.sleep(0.01)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_get_tokenizer_streams_a_zip_with_its_sha256(stub):
    chunks = [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest())]
    data = b"".join(c.data for c in chunks)
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    assert all(c.sha256 == "" for c in chunks[:-1])
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert set(zf.namelist()) == {"tokenizer.json", "tokenizer_config.json"}
        config = json.loads(zf.read("tokenizer_config.json"))
        tok = HFTokenizer.from_str(zf.read("tokenizer.json").decode())
    assert "chat_template" in config
    assert tok.encode(LONG, add_special_tokens=False).ids == TOK.encode(LONG)


async def test_abort_frees_the_kv_at_once(slow):
    server, stub, client = slow
    call = stub.Generate(gen(TOK.encode(LONG), rid="ab-1", max_tokens=3000, ignore_eos=True))
    first = await call.read()
    assert first.chunk.token_ids
    cap = (await client.get_deployment("slow")).capacity
    assert cap.kv_blocks_free < cap.kv_blocks_total
    await stub.Abort(vpb.AbortRequest(request_ids=["ab-1", "never-seen"]))
    rest = await read_rest(call)
    assert rest[-1].complete.finish_reason == "abort"
    server.wait_for_log(r"\[request_id=ab-1\] finished on slow: abort")
    await assert_released(client, "slow")


async def test_cancelled_stream_aborts_the_request(slow):
    server, stub, client = slow
    call = stub.Generate(gen(TOK.encode("hello"), rid="cx-1", max_tokens=3000, ignore_eos=True))
    await call.read()
    call.cancel()
    server.wait_for_log(r"\[request_id=cx-1\] finished on slow: abort")
    await assert_released(client, "slow")


async def test_full_queue_is_resource_exhausted_and_loads_are_real(slow):
    server, stub, client = slow
    calls = [stub.Generate(gen(TOK.encode(LONG), rid=f"q-{i}", max_tokens=3000,
                               ignore_eos=True)) for i in range(3)]
    await until(client, "slow", lambda d: (d.load.num_running, d.load.num_waiting) == (1, 2))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await responses(stub, gen(TOK.encode("one more"), max_tokens=2))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    loads = await stub.GetLoads(vpb.GetLoadsRequest())
    assert loads.dp_rank_count == 1
    load = loads.loads[0]
    assert (load.num_running_reqs, load.num_waiting_reqs, load.num_total_reqs) == (1, 2, 3)
    assert load.max_running_requests == 1 and 0 < load.token_usage < 1
    assert load.num_used_tokens > 0 and load.max_total_num_tokens > load.num_used_tokens
    # smg-grpc-servicer 0.14.1's bookkeeping: the two queued prompts, none of them cached yet
    # (the running one's first output found nothing cached), count as uncached work
    assert load.num_waiting_uncached_tokens == 2 * len(TOK.encode(LONG))
    assert load.cache_hit_rate == 0.0 and load.utilization == load.token_usage
    assert loads.version == VLLM_VERSION  # the vLLM release whose servicer this is
    server = await stub.GetServerInfo(vpb.GetServerInfoRequest())
    assert server.active_requests == 3 and server.max_num_seqs == 1
    assert server.last_receive_timestamp > 0
    await stub.Abort(vpb.AbortRequest(request_ids=[f"q-{i}" for i in range(3)]))
    for call in calls:
        assert (await read_rest(call))[-1].complete.finish_reason == "abort"
    await assert_released(client, "slow")


async def test_cold_deployment_is_unhealthy_and_unavailable():
    cold = {"name": "cold", "model": "llama-3.1-8b", "quant": "fp8", "chip": "h100-sxm",
            "engine": "tensorrt-llm", "built_for": "hopper", "start": "cold"}
    with ServerProcess(fleet_doc(deployments=[cold])) as server:
        async with grpc.aio.insecure_channel(server.target) as channel:
            stub = vpb_grpc.VllmEngineStub(channel)
            health = await stub.HealthCheck(vpb.HealthCheckRequest())
            assert not health.healthy and "compiling" in health.message
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await responses(stub, gen(TOK.encode("early"), max_tokens=2))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE_NAME))
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING


def test_vllm_engine_deployment_must_name_a_deployment():
    with pytest.raises(ConfigError, match="vllm_engine_deployment"):
        make_fleet({"vllm_engine_deployment": "nope"})
    assert make_fleet().vllm_engine_deployment == "fast"
    assert make_fleet({"vllm_engine_deployment": "slow"}).vllm_engine_deployment == "slow"


async def test_reflection_lists_the_vllm_engine_service(server):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    def services() -> tuple[list[str], list[str]]:
        with grpc.insecure_channel(server.target) as channel:
            db = ProtoReflectionDescriptorDatabase(channel)
            desc = db.FindFileContainingSymbol(SERVICE_NAME)
            return list(db.get_services()), [m.name for m in desc.service[0].method]

    names, methods = await asyncio.to_thread(services)
    assert {SERVICE_NAME, "doppelchip.v1.Inference"} <= set(names)
    assert {"Generate", "Abort", "HealthCheck", "GetTokenizer", "GetLoads"} <= set(methods)
