"""An MLX pod's gRPC service (`mlx.grpc.engine.MlxEngine`, what smg's MLX servicer serves) over
real gRPC, without the gateway: the shapes smg reads (chunks with new ids and cumulative
counts, then a complete with no ids; not streaming, one complete with all of them), MLX's
sampling defaults, stops (a stop token id and EOS both name the token that matched), logprobs,
the refusals, the management calls, and every request freed however it ends."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from types import SimpleNamespace

import grpc
import pytest
from engine_service_checks import Wire, check_health_and_tokenizer, check_storm, released
from server_proc import ServerProcess, read_rest
from smg_grpc_proto import mlx_engine_pb2 as mpb
from smg_grpc_proto import mlx_engine_pb2_grpc as mpb_grpc

from server import mlx_convert as mc
from server.engine.interface import DeploymentState
from server.engine.tokenizer import get_tokenizer
from server.mlx_servicer import SERVICE_NAME, MlxEngineServicer

TOK = get_tokenizer()
CTX = 256
POD = ("--deployment", "mlx-m4max", "--max-model-len", str(CTX), "--grpc-api", "mlx")
IDS = TOK.encode("hello world, the generation loop speaks")


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *POD, "--time-scale", "0.05") as s:
        yield s


@pytest.fixture(scope="module")
def slow_pod():
    """Real time, one request running at a time: a stream is still running when its Abort
    comes."""
    with ServerProcess(None, *POD, "--time-scale", "1", "--max-num-seqs", "1") as s:
        yield s


@pytest.fixture
async def stub(pod) -> AsyncIterator[mpb_grpc.MlxEngineStub]:
    async with grpc.aio.insecure_channel(pod.target) as channel:
        yield mpb_grpc.MlxEngineStub(channel)


def gen(ids=IDS, rid: str = "", stream: bool = True, **sampling) -> mpb.GenerateRequest:
    sampling.setdefault("max_tokens", 16)
    return mpb.GenerateRequest(request_id=rid, tokenized=mpb.TokenizedInput(input_ids=ids),
                               stream=stream, sampling_params=mpb.SamplingParams(**sampling))


async def responses(stub, request) -> list[mpb.GenerateResponse]:
    return [r async for r in stub.Generate(request)]


async def complete(stub, **kw) -> mpb.GenerateComplete:
    (msg,) = await responses(stub, gen(stream=False, **kw))
    return msg.complete


async def test_a_stream_is_chunks_of_new_ids_then_a_complete_without_ids(stub, pod):
    call = stub.Generate(gen(rid="m-1", max_tokens=12, ignore_eos=True, seed=5))
    assert ("x-request-id", "m-1") in tuple(await call.initial_metadata())
    msgs = [m async for m in call]
    kinds = [m.WhichOneof("response") for m in msgs]
    assert kinds[-1] == "complete" and set(kinds[:-1]) == {"chunk"}
    chunks = [m.chunk for m in msgs[:-1]]
    assert all(c.token_ids and c.index == 0 and c.cached_tokens == 0 for c in chunks)
    assert [c.completion_tokens for c in chunks] == list(
        itertools.accumulate(len(c.token_ids) for c in chunks))
    assert all(c.prompt_tokens == len(IDS) for c in chunks)
    done = msgs[-1].complete
    assert (done.finish_reason, done.completion_tokens, done.prompt_tokens, done.index) == \
        ("length", 12, len(IDS), 0)
    assert not done.output_ids and not done.HasField("matched_stop_token_id")  # in the chunks
    whole = await responses(stub, gen(stream=False, max_tokens=12, ignore_eos=True, seed=5))
    assert [m.WhichOneof("response") for m in whole] == ["complete"]
    assert list(whole[0].complete.output_ids) == [t for c in chunks for t in c.token_ids]
    assert whole[0].complete.completion_tokens == 12
    await released(pod)


def test_sampling_reads_mlx_defaults():
    """As smg's MLX servicer reads SamplingParams: unset temperature is 1.0 (set 0, greedy);
    top_k 0 and top_p 0 cut nothing; penalties 0 are none; unset max_tokens is what the
    context leaves; the stops are the stop token ids (EOS unless ignore_eos)."""
    unset = mc.to_engine_request(gen(max_tokens=None), "r", CTX, 20).sampling
    assert (unset.temperature, unset.top_k, unset.top_p, unset.min_p, unset.repetition_penalty,
            unset.max_tokens, unset.seed, unset.ignore_eos) == \
        (1.0, -1, 1.0, 0.0, 1.0, CTX - len(IDS), None, False)
    sp = mc.to_engine_request(gen(temperature=0.0, top_k=5, top_p=0.5, min_p=0.125,
                                  repetition_penalty=1.25, presence_penalty=0.25, seed=7,
                                  stop_token_ids=[9, 11], ignore_eos=True), "r", CTX, 20)
    s = sp.sampling
    assert (s.temperature, s.top_k, s.top_p, s.repetition_penalty, s.presence_penalty, s.seed,
            s.stop_token_ids, s.ignore_eos, s.max_tokens) == \
        (0.0, 5, 0.5, 1.25, 0.25, 7, (9, 11), True, 16)
    assert s.min_p == 0.125 and sp.prompt_token_ids == tuple(IDS)


async def test_a_stop_token_id_and_eos_name_the_token_that_matched(stub):
    out = list((await complete(stub, ignore_eos=True, seed=2)).output_ids)
    stopped = await complete(stub, ignore_eos=True, seed=2, stop_token_ids=[out[4]])
    assert (stopped.finish_reason, stopped.matched_stop_token_id) == ("stop", out[4])
    assert list(stopped.output_ids) == out[:out.index(out[4]) + 1]  # the stop token included
    # 16 seeds: the mock model's end of sequence (mean length 128) ends some before 200
    runs = await asyncio.gather(*(complete(stub, max_tokens=200, seed=s) for s in range(16)))
    ends = {(r.finish_reason, r.matched_stop_token_id if r.HasField("matched_stop_token_id")
             else None) for r in runs}
    eos = TOK.eos_token_id
    assert ("stop", eos) in ends and ends <= {("stop", eos), ("length", None)}
    assert all(r.output_ids[-1] == eos for r in runs if r.finish_reason == "stop")
    ignored = await asyncio.gather(*(complete(stub, max_tokens=200, seed=s, ignore_eos=True)
                                     for s in range(4)))
    assert {r.finish_reason for r in ignored} == {"length"}


async def test_logprobs_streamed_equal_logprobs_whole(stub):
    whole = await complete(stub, max_tokens=5, ignore_eos=True, logprobs=3, seed=4)
    lp = whole.output_logprobs
    assert list(lp.token_ids) == list(whole.output_ids) and len(lp.top_logprobs) == 5
    for token, value, top in zip(lp.token_ids, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top.token_ids) == len(top.values) == 3 and value <= 0
        assert (top.token_ids[0], top.values[0]) == (token, value)
        assert list(top.values) == sorted(top.values, reverse=True)  # most likely first
    msgs = await responses(stub, gen(max_tokens=5, ignore_eos=True, logprobs=3, seed=4))
    streamed = [m.chunk.output_logprobs for m in msgs if m.HasField("chunk")]
    assert [t for s in streamed for t in s.token_ids] == list(lp.token_ids)
    assert [v for s in streamed for v in s.token_logprobs] == list(lp.token_logprobs)
    assert [t for s in streamed for t in s.top_logprobs] == list(lp.top_logprobs)
    assert not msgs[-1].complete.HasField("output_logprobs")  # streaming: in the chunks
    for k in (0, -1):
        assert not (await complete(stub, max_tokens=3, logprobs=k)).HasField("output_logprobs")


async def test_max_tokens_unset_is_what_the_context_leaves(stub, pod):
    left = CTX - len(IDS)
    unset = await complete(stub, ignore_eos=True, max_tokens=None)
    assert (unset.finish_reason, unset.completion_tokens) == ("length", left)
    past = await complete(stub, ignore_eos=True, max_tokens=100_000)
    assert (past.finish_reason, past.completion_tokens) == ("length", left)
    zero = await complete(stub, ignore_eos=True, max_tokens=0)  # mlx-lm runs one token
    assert (zero.finish_reason, zero.completion_tokens) == ("length", 1)
    await released(pod)


@pytest.mark.parametrize("request_, says", [
    (mpb.GenerateRequest(request_id="x", text="hello"), "MLX servicer requires tokenized input"),
    (mpb.GenerateRequest(request_id="x"), "MLX servicer requires tokenized input"),
    (gen([]), "prompt is empty"),
    (gen([1] * CTX), f"Prompt length ({CTX}) leaves no room for an output token"),
    (gen(logit_bias={5: 1.0}), "logit_bias is not emulated"),
    (gen(logprobs=2000), "Requested sample logprobs of 2000, which is greater than max "
                         "allowed: 20"),
    (gen(temperature=-1.0), "temperature"),
    (gen(rid="bad\nid"), "control character"),
])
async def test_refusals_are_invalid_argument(stub, pod, request_, says):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await responses(stub, request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in err.value.details()
    await released(pod)


async def test_a_request_id_in_flight_is_refused(slow_pod):
    async with grpc.aio.insecure_channel(slow_pod.target) as channel:
        stub = mpb_grpc.MlxEngineStub(channel)
        call = stub.Generate(gen(rid="dup", max_tokens=400, ignore_eos=True))
        await call.read()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await responses(stub, gen(rid="dup", max_tokens=2))
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        call.cancel()
    await released(slow_pod)


async def _healthy(stub) -> bool:
    r = await stub.HealthCheck(mpb.HealthCheckRequest())
    return r.healthy and r.message == "OK"


WIRE = Wire(mpb_grpc.MlxEngineStub,
            lambda rid, stream, max_tokens, n: gen(rid=rid, stream=stream,
                                                   max_tokens=max_tokens, ignore_eos=True),
            lambda rid: mpb.AbortRequest(request_ids=[rid]),
            lambda m: m.complete.finish_reason if m.HasField("complete") else "",
            "", _healthy)


async def test_health_model_server_info_and_tokenizer(stub, pod):
    await check_health_and_tokenizer(pod, WIRE, SERVICE_NAME)
    m = await stub.GetModelInfo(mpb.GetModelInfoRequest())
    assert (m.served_model_name, m.model_path, m.is_generation, m.max_context_length,
            m.max_req_input_len, m.vocab_size, list(m.eos_token_ids)) == \
        ("llama-3.1-8b", "llama-3.1-8b", True, CTX, CTX, TOK.vocab_size, [TOK.eos_token_id])
    assert (m.model_type, list(m.architectures)) == ("llama", ["LlamaForCausalLM"])
    info = await stub.GetServerInfo(mpb.GetServerInfoRequest())
    assert (info.server_type, info.active_requests) == ("mlx-grpc", 0)
    assert info.uptime_seconds > 0


@pytest.mark.parametrize("state, draining, healthy, message", [
    (DeploymentState.READY, False, True, "OK"),
    (DeploymentState.COMPILING, False, False, "generation loop not started"),
    (DeploymentState.FAILED, False, False, "generation thread exited"),
    (DeploymentState.READY, True, False, "servicer shutting down"),
])
async def test_health_check_says_why_it_is_not_healthy(state, draining, healthy, message):
    client = SimpleNamespace(views=[None], status=lambda: SimpleNamespace(state=state))
    servicer = MlxEngineServicer(client)  # type: ignore[arg-type]
    servicer.draining = draining
    r = await servicer.HealthCheck(mpb.HealthCheckRequest(), None)  # type: ignore[arg-type]
    assert (r.healthy, r.message) == (healthy, message)


async def test_server_info_counts_the_requests_in_flight(slow_pod):
    async with grpc.aio.insecure_channel(slow_pod.target) as channel:
        stub = mpb_grpc.MlxEngineStub(channel)
        call = stub.Generate(gen(rid="busy", max_tokens=400, ignore_eos=True))
        await call.read()
        info = await stub.GetServerInfo(mpb.GetServerInfoRequest())
        assert info.active_requests == 1
        call.cancel()
    await released(slow_pod)


async def test_abort_is_owned_and_frees_the_request(slow_pod):
    """Another connection's Abort ends nothing (the stream runs on); the owner's, among other
    ids, ends the stream with no complete and frees it; an Abort before its Generate makes
    that Generate end at once with nothing."""
    own = [("grpc.use_local_subchannel_pool", 1)]  # two connections, two peers
    async with grpc.aio.insecure_channel(slow_pod.target, options=own) as mine, \
            grpc.aio.insecure_channel(slow_pod.target, options=own) as theirs:
        stub, other = mpb_grpc.MlxEngineStub(mine), mpb_grpc.MlxEngineStub(theirs)
        call = stub.Generate(gen(rid="ab-1", max_tokens=400, ignore_eos=True))
        first = (await call.read()).chunk.completion_tokens
        assert await other.Abort(mpb.AbortRequest(request_ids=["ab-1"])) == mpb.AbortResponse()
        start = slow_pod.log.count("\n")
        later = [await call.read() for _ in range(8)]  # still running: chunk after chunk
        assert all(m.HasField("chunk") for m in later)
        assert "Abort from the client" not in "\n".join(slow_pod.log.splitlines()[start:])
        await stub.Abort(mpb.AbortRequest(request_ids=["nobody", "ab-1"]))
        rest = await read_rest(call)
        assert not [m for m in rest if m.HasField("complete")]  # aborted: no complete
        assert later[-1].chunk.completion_tokens + len(rest) < 400 and first >= 1
        await released(slow_pod)
        await stub.Abort(mpb.AbortRequest(request_ids=["ab-2"]))  # before its Generate
        assert await responses(stub, gen(rid="ab-2", max_tokens=4)) == []  # nothing ran
        slow_pod.wait_for_log(r"\[request_id=ab-2\] aborted before it arrived")
    await released(slow_pod)


async def test_a_cancelled_stream_frees_the_request(slow_pod):
    async with grpc.aio.insecure_channel(slow_pod.target) as channel:
        call = mpb_grpc.MlxEngineStub(channel).Generate(gen(rid="cx-1", max_tokens=400,
                                                            ignore_eos=True))
        await call.read()
        call.cancel()
    slow_pod.wait_for_log(r"\[request_id=cx-1\] finished on .*: abort")
    await released(slow_pod)


async def test_a_cancellation_storm_leaves_the_pool_idle(pod):
    await check_storm(pod, WIRE, seed=13)
