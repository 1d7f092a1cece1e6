"""Request ids and aborts (issue 14): ids checked before anything is submitted, echoed as valid
metadata, unique while in flight; aborts owned by the connection that started the request,
remembered when they overtake it, never reaching a later request that reuses the id; a
message that does not decode is INVALID_ARGUMENT, not UNKNOWN."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import pytest
from fleets import assert_released, fleet_doc
from server_proc import ServerProcess, until
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc

from clients.client import AsyncClient, build_request
from server.frontend.request_ids import metadata_value

# channels to one target share a connection unless told otherwise: another client's
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
HOLD = {"max_tokens": 3000, "ignore_eos": True}  # runs for minutes on `slow`


@pytest.fixture(scope="module")
def slow_server():
    """VllmEngine fronts `slow` (one sequence at a time, two waiting)."""
    with ServerProcess(fleet_doc({"vllm_engine_deployment": "slow"})) as s:
        yield s


def gen(rid: str, **sampling) -> vpb.GenerateRequest:
    return vpb.GenerateRequest(request_id=rid, tokenized=vpb.TokenizedInput(input_ids=[5, 6]),
                               sampling_params=vpb.SamplingParams(**sampling), stream=True)


@pytest.mark.parametrize("rid", ["a\nb", "nul\x00", "esc\x1b[31m", "x" * 257, "é" * 129])
async def test_bad_ids_are_refused_before_anything_runs(slow_server, rid):
    async with AsyncClient(slow_server.target) as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in client.stub.Generate(build_request(
                    "hi", deployment="slow", request_id=rid, **HOLD)):
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "request id" in err.value.details()
        await assert_released(client, "slow")  # the orphan of issue 14 #1 is gone
    async with grpc.aio.insecure_channel(slow_server.target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in vpb_grpc.VllmEngineStub(channel).Generate(gen(rid, max_tokens=2)):
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    async with httpx.AsyncClient(base_url=slow_server.http_url) as h:
        r = await h.post("/v1/completions", json={"model": "llama-3.1-70b", "prompt": "hi",
                                                  "max_tokens": 2, "request_id": rid})
        assert r.status_code == 400 and r.json()["error"]["param"] == "request_id"
    if not rid.isprintable():  # logged escaped: it cannot forge or recolour a line
        assert rid not in slow_server.log
        assert rid.encode("unicode_escape").decode() in slow_server.log


async def test_a_non_ascii_id_runs_and_is_echoed_percent_encoded(slow_server):
    rid = "üñí©ødé-1"
    async with AsyncClient(slow_server.target) as client:
        call = client.stub.Generate(build_request("hi", deployment="fast", request_id=rid,
                                                  max_tokens=3))
        meta = dict(await call.initial_metadata())
        assert meta["x-request-id"] == metadata_value(rid)
        assert metadata_value(rid) == "%C3%BC%C3%B1%C3%AD%C2%A9%C3%B8d%C3%A9-1"
        chunks = [c async for c in call]
        assert chunks[-1].request_id == rid and chunks[-1].final.usage.completion_tokens == 3
    async with httpx.AsyncClient(base_url=slow_server.http_url) as h:
        r = await h.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2,
                                                  "request_id": rid})
        assert r.status_code == 200 and r.headers["x-request-id"] == metadata_value(rid)


async def test_a_duplicate_id_in_flight_is_already_exists_and_409(slow_server):
    async with AsyncClient(slow_server.target) as client, \
            httpx.AsyncClient(base_url=slow_server.http_url, timeout=30) as h:
        call = client.stub.Generate(build_request("a", deployment="slow", request_id="twin",
                                                  **HOLD))
        await call.read()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in client.generate("b", deployment="slow", request_id="twin"):
                pass
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        body = {"model": "llama-3.1-70b", "prompt": "c", "max_tokens": 2}
        held = asyncio.create_task(h.post("/v1/completions", json={**body, **HOLD},
                                          headers={"X-Request-Id": "http-twin"}))
        await until(client, "slow", lambda d: d.load.num_waiting >= 1)
        r = await h.post("/v1/completions", json=body, headers={"X-Request-Id": "http-twin"})
        assert r.status_code == 409 and "already in flight" in r.json()["error"]["message"]
        held.cancel()
        call.cancel()
        await assert_released(client, "slow")
        # free again once it ended: the id can be used anew
        again = [c async for c in client.generate("d", deployment="slow", request_id="twin",
                                                  max_tokens=2)]
        assert again[-1].final.usage.completion_tokens == 2


async def test_aborts_are_owned_remembered_and_never_reach_a_reused_id(slow_server):
    async with grpc.aio.insecure_channel(slow_server.target) as mine, \
            grpc.aio.insecure_channel(slow_server.target, options=OWN_CONNECTION) as other, \
            AsyncClient(slow_server.target) as client:
        me, them = vpb_grpc.VllmEngineStub(mine), vpb_grpc.VllmEngineStub(other)
        # another connection's Abort answers OK and does nothing
        call = me.Generate(gen("owned", max_tokens=40, ignore_eos=True))
        assert (await call.read()).chunk.token_ids
        await them.Abort(vpb.AbortRequest(request_ids=["owned"]))
        rest = []
        while (r := await call.read()) is not grpc.aio.EOF:
            rest.append(r)
        assert rest[-1].complete.finish_reason == "length"
        # the same id again, finished moments ago: a late Abort must not hit its reuse
        await me.Abort(vpb.AbortRequest(request_ids=["owned"]))
        reuse = [r async for r in me.Generate(gen("owned", max_tokens=3, ignore_eos=True))]
        assert reuse[-1].complete.finish_reason == "length"
        # an Abort that overtakes its Generate ends it at once, as "abort"
        await me.Abort(vpb.AbortRequest(request_ids=["early"]))
        early = [r async for r in me.Generate(gen("early", **HOLD))]
        assert [r.complete.finish_reason for r in early] == ["abort"]
        # ... only on its own connection: another connection's "early" runs
        late = [r async for r in them.Generate(gen("early", max_tokens=2, ignore_eos=True))]
        assert late[-1].complete.finish_reason == "length"
        await assert_released(client, "slow")


async def test_a_message_that_does_not_decode_is_invalid_argument(slow_server):
    # field 1 (request_id, a string) holding the bytes ff fe: not UTF-8
    raw = b"\x0a\x02\xff\xfe"
    async with grpc.aio.insecure_channel(slow_server.target) as channel:
        for method in ("/doppelchip.v1.Inference/Generate",
                       "/vllm.grpc.engine.VllmEngine/Generate"):
            call = channel.unary_stream(method, request_serializer=None,
                                        response_deserializer=None)(raw)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in call:
                    pass
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
            assert "UTF-8" in err.value.details()
        unary = channel.unary_unary("/doppelchip.v1.Inference/GetDeployment",
                                    request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await unary(raw)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Traceback" not in slow_server.log

