"""Bad input gets the right status code and a message saying what is wrong; nothing is harmed."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from fleets import assert_released

from clients.client import build_request
from doppelchip.v1 import inference_pb2 as pb

BAD_INPUTS = [
    # (kwargs for the request, expected code, words the message must contain)
    (dict(deployment="nope"), grpc.StatusCode.NOT_FOUND, "unknown deployment 'nope'"),
    (dict(model="gpt-9"), grpc.StatusCode.NOT_FOUND, "no deployment serves model 'gpt-9'"),
    (dict(deployment="fast", model="llama-3.1-70b"), grpc.StatusCode.NOT_FOUND, "serves"),
    (dict(prompt=""), grpc.StatusCode.INVALID_ARGUMENT, "prompt is empty"),
    (dict(prompt=[]), grpc.StatusCode.INVALID_ARGUMENT, "prompt is missing"),
    (dict(max_tokens=0), grpc.StatusCode.INVALID_ARGUMENT, "max_tokens must be > 0"),
    (dict(max_tokens=-5), grpc.StatusCode.INVALID_ARGUMENT, "max_tokens must be > 0"),
    (dict(prompt=list(range(10, 310))), grpc.StatusCode.INVALID_ARGUMENT,
     "prompt is 300 tokens; deployment 'fast' has a context of 256 tokens"),
    (dict(prompt=list(range(10, 210)), max_tokens=100), grpc.StatusCode.INVALID_ARGUMENT,
     "prompt (200 tokens) + max_tokens (100) exceeds deployment 'fast'"),
    (dict(n=0), grpc.StatusCode.INVALID_ARGUMENT, "n must be in [1, 128], got 0"),
    (dict(logprobs=5), grpc.StatusCode.INVALID_ARGUMENT, "logprobs=5 is not supported"),
    (dict(temperature=-1.0), grpc.StatusCode.INVALID_ARGUMENT, "temperature must be >= 0"),
    (dict(top_p=0.0), grpc.StatusCode.INVALID_ARGUMENT, "top_p must be in (0, 1]"),
    (dict(top_k=-3), grpc.StatusCode.INVALID_ARGUMENT, "top_k"),
    (dict(min_tokens=10, max_tokens=5), grpc.StatusCode.INVALID_ARGUMENT, "min_tokens"),
    (dict(presence_penalty=3.0), grpc.StatusCode.INVALID_ARGUMENT, "presence_penalty"),
    (dict(stop=[""]), grpc.StatusCode.INVALID_ARGUMENT, "stop strings must not be empty"),
    (dict(prompt=[7, 999999]), grpc.StatusCode.INVALID_ARGUMENT, "999999 is out of vocabulary"),
    (dict(temperature=float("nan")), grpc.StatusCode.INVALID_ARGUMENT, "finite number"),
    (dict(repetition_penalty=float("inf")), grpc.StatusCode.INVALID_ARGUMENT, "finite number"),
    (dict(min_tokens=10_000), grpc.StatusCode.INVALID_ARGUMENT,
     "+ min_tokens (10000) exceeds deployment 'fast'"),
    (dict(stop=[f"s{i}" for i in range(300)]), grpc.StatusCode.INVALID_ARGUMENT,
     "300 stop strings; deployment 'fast' accepts at most 256 (max_stop_strings)"),
    (dict(stop=["x" * 2000]), grpc.StatusCode.INVALID_ARGUMENT,
     "a stop string is 2000 bytes; deployment 'fast' accepts at most 1024 (max_stop_bytes)"),
    (dict(prompt="word " * 500_000), grpc.StatusCode.INVALID_ARGUMENT,
     "prompt is 2500000 bytes; deployment 'fast' accepts at most 2000000 (max_prompt_bytes)"),
]


def _request(kwargs: dict) -> pb.GenerateRequest:
    kwargs = dict(kwargs)
    prompt = kwargs.pop("prompt", "hello")
    if prompt == []:
        req = build_request("x", **kwargs)
        req.ClearField("text")
        return req
    return build_request(prompt, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "code", "words"), BAD_INPUTS, ids=[str(b[0])[:40] for b in BAD_INPUTS]
)
async def test_bad_input_status_and_message(client, kwargs, code, words):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in client.stub.Generate(_request(kwargs)):
            pass
    assert err.value.code() == code
    assert words in err.value.details()
    # nothing allocated, nothing queued, and the server still serves
    for name in ("fast", "slow"):
        await assert_released(client, name)
    chunks = [c async for c in client.generate("still fine", max_tokens=2, ignore_eos=True)]
    assert chunks[-1].final.usage.completion_tokens == 2


async def test_constraint_that_does_not_compile_is_refused(client):
    req = build_request("hello")
    req.constraint.regex = "[a-z"  # more cases: tests/structured/
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in client.stub.Generate(req):
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "regex constraint does not compile" in err.value.details()


async def test_duplicate_request_id_in_flight(client):
    stream = client.generate("a", deployment="slow", max_tokens=1000, ignore_eos=True,
                             request_id="dup")
    first = await anext(stream)
    assert first.request_id == "dup"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in client.generate("b", deployment="slow", request_id="dup"):
            pass
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "already in flight" in err.value.details()
    await stream.aclose()


async def test_full_waiting_queue_is_resource_exhausted(client, server):
    # "slow" has max_num_seqs=1, max_waiting=2
    def held(i: int):
        return client.stub.Generate(build_request(
            "q", deployment="slow", max_tokens=1000, ignore_eos=True, request_id=f"held-{i}"))

    calls = [held(0)]
    assert (await calls[0].read()).request_id == "held-0"  # streaming: it is running
    calls += [held(1), held(2)]
    # initial metadata is sent right after the engine accepted the request
    for call in calls[1:]:
        assert dict(await call.initial_metadata())["x-request-id"].startswith("held-")
    status = await client.get_deployment("slow")
    assert (status.load.num_running, status.load.num_waiting) == (1, 2)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in client.generate("one too many", deployment="slow", max_tokens=5):
            pass
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "waiting queue is full (max_waiting=2)" in err.value.details()
    for call in calls:
        call.cancel()
    await assert_released(client, "slow")
    for i in range(3):
        server.wait_for_log(rf"\[request_id=held-{i}\] finished on slow: abort")


async def test_a_long_prompt_is_tokenized_off_the_event_loop(client):
    """Tokenizing ~1.9 MB of text takes the better part of a second; meanwhile the front end
    answers health checks (the tokenizer runs in a thread with the GIL released): the health
    check started after the Generate finishes before the Generate is even admitted."""
    from grpc_health.v1 import health_pb2

    call = client.stub.Generate(build_request("fox jumps. " * 170_000, max_tokens=1,
                                              deployment="fast"))
    order: list[str] = []

    async def admitted() -> None:
        try:
            await call.initial_metadata()
        finally:
            order.append("generate")

    async def health() -> None:
        await asyncio.sleep(0.05)  # a schedule: send the health check once the Generate is in
        await client.health_stub.Check(health_pb2.HealthCheckRequest(service=""))
        order.append("health")

    await asyncio.gather(admitted(), health())
    with pytest.raises(grpc.aio.AioRpcError) as err:  # 1.9 MB of text is far beyond 256 tokens
        async for _ in call:
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert order == ["health", "generate"]
