"""Checks every engine gRPC service smg fronts must pass, whatever its wire (SGLang's
`SglangScheduler`, TensorRT-LLM's `TrtllmService`): an Abort is owned by the connection that
started the request and frees it, an Abort that comes before its Generate ends that Generate at
once, and a storm of requests their clients end at random leaves the pool idle and the log
clean; a cancelled stream of two outputs frees both; the pod's standard health names the
service, which replaces vLLM's, and the tokenizer bundle is a verified zip. Each service's test
file describes its wire (`Wire`) and calls them."""

from __future__ import annotations

import asyncio
import hashlib
import io
import random
import zipfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from fleets import assert_released
from grpc_health.v1 import health_pb2, health_pb2_grpc
from server_proc import ServerProcess, end_at_random, read_rest
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc
from smg_grpc_proto.generated import common_pb2

from clients.client import AsyncClient


@dataclass(frozen=True)
class Wire:
    """One engine service as the checks drive it."""

    stub: type  # the service's stub class
    generate: Callable[..., Any]  # (rid, streaming, max_tokens, n) -> a GenerateRequest
    abort: Callable[[str], Any]  # rid -> an AbortRequest
    finish: Callable[[Any], str]  # a response -> its finish reason ("" for a chunk)
    aborted: str  # the finish reason of an aborted request
    healthy: Callable[[Any], Awaitable[bool]]  # stub -> whether HealthCheck says healthy


async def released(pod: ServerProcess) -> None:
    async with AsyncClient(pod.target) as c:
        await assert_released(c, (await c.list_deployments()).deployments[0].name)


async def check_owned_abort(pod: ServerProcess, wire: Wire) -> None:
    """On a pod that runs one request at a time in real time: another connection's Abort ends
    nothing ("not found"), the owner's ends the stream with `wire.aborted` and frees it; an
    Abort before its Generate makes that Generate end at once, having run nothing."""
    own = [("grpc.use_local_subchannel_pool", 1)]  # two connections, two peers
    async with grpc.aio.insecure_channel(pod.target, options=own) as mine, \
            grpc.aio.insecure_channel(pod.target, options=own) as theirs:
        stub, other = wire.stub(mine), wire.stub(theirs)
        call = stub.Generate(wire.generate("ab-1", True, 400, 1))
        assert wire.finish(await call.read()) == ""  # running: its first chunk
        refused = await other.Abort(wire.abort("ab-1"))
        assert (refused.success, refused.message) == (False, "Request ab-1 not found")
        ok = await stub.Abort(wire.abort("ab-1"))
        assert (ok.success, ok.message) == (True, "Request ab-1 aborted")
        rest = await read_rest(call)
        assert wire.finish(rest[-1]) == wire.aborted
        await released(pod)
        early = await stub.Abort(wire.abort("ab-2"))  # before its Generate
        assert not early.success
        msgs = [m async for m in stub.Generate(wire.generate("ab-2", True, 4, 1))]
        assert [wire.finish(m) for m in msgs] == [wire.aborted]  # nothing ran
    await released(pod)


async def check_storm(pod: ServerProcess, wire: Wire, seed: int) -> None:
    """120 requests (1 or 2 outputs, streaming or not) ended by their clients at seeded
    random points — before admission, mid-stream, by a deadline: afterwards the service is
    healthy, nothing runs or waits, every KV block is free, and the front end logged no error
    (it did not crash)."""
    rng = random.Random(seed)
    start = len(pod.log)

    async def one(stub, i: int) -> str:
        how = rng.choice(("sleep", "chunks", "deadline"))
        call = stub.Generate(wire.generate(f"storm-{i}", rng.random() < 0.7, 200,
                                           rng.choice((1, 2))),
                             timeout=rng.uniform(0.001, 0.1) if how == "deadline" else 30)
        return await end_at_random(call, how, rng)

    async with grpc.aio.insecure_channel(pod.target) as channel:
        stub = wire.stub(channel)
        outcomes = await asyncio.gather(*(one(stub, i) for i in range(120)))
        assert set(outcomes) <= {"OK", "CANCELLED", "DEADLINE_EXCEEDED"}, outcomes
        assert await wire.healthy(stub)
    await released(pod)
    assert not [line for line in pod.log[start:].splitlines()
                if " ERROR " in line or line.startswith("Traceback")]


async def check_cancelled_stream(pod: ServerProcess, wire: Wire) -> None:
    """A stream of two outputs cancelled after its first message: both are aborted, the pool
    freed."""
    async with grpc.aio.insecure_channel(pod.target) as channel:
        call = wire.stub(channel).Generate(wire.generate("cx-1", True, 400, 2))
        await call.read()
        call.cancel()
    pod.wait_for_log(r"\[request_id=1_cx-1\] finished on .*: abort")
    await released(pod)


async def check_health_and_tokenizer(pod: ServerProcess, wire: Wire, service: str) -> None:
    """`grpc.health.v1` answers SERVING for "" and `service`; vLLM's engine service is not
    served beside it (UNIMPLEMENTED: smg must detect this one); `GetTokenizer` streams a zip
    of tokenizer.json and tokenizer_config.json whose sha256 the last chunk carries."""
    async with grpc.aio.insecure_channel(pod.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", service):
            r = await health.Check(health_pb2.HealthCheckRequest(service=name))
            assert r.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await vpb_grpc.VllmEngineStub(channel).HealthCheck(vpb.HealthCheckRequest())
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert await wire.healthy(wire.stub(channel))
        data, digest = b"", ""
        async for chunk in wire.stub(channel).GetTokenizer(common_pb2.GetTokenizerRequest()):
            data += chunk.data
            digest = chunk.sha256
    assert digest == hashlib.sha256(data).hexdigest()
    assert set(zipfile.ZipFile(io.BytesIO(data)).namelist()) == {"tokenizer.json",
                                                                  "tokenizer_config.json"}
