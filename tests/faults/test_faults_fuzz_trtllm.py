"""A property-based fuzzer over a TensorRT-LLM pod's gRPC service (`trtllm.TrtllmService`), as
`test_faults_fuzz_sglang.py` is over an SGLang pod's: random GenerateRequests (odd sampling
values, NaN and infinities, beam widths, huge stop lists, guides, n, logprobs, max_tokens
around the context, unserved fields), invalid UTF-8 written on the wire by hand, random bytes
to every method, and Aborts, ended by reading, a cancel or a 50 ms deadline, concurrently (ids
drawn from a small pool collide). The pod's HTTP port is the vLLM API, fuzzed by
`test_faults_fuzz.py`.

Properties, over 960 cases (20 examples of 48, derandomized): every answer is a status the
servicer documents that a serving pod may give (`documented.py`), no read hangs; afterwards the
pod is idle (nothing running or waiting, every KV block free), every pooled id is free again,
and its log holds no error or traceback.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from documented import TRTLLM_SERVICE, allowed_grpc
from fuzz_env import DEADLINE, READ_TIMEOUT, LoopThread, run_batches, status_of
from fuzz_strategies import (
    ACTION,
    BAD_UTF8,
    FLOAT,
    ID_POOL,
    REQUEST_ID,
    SAFE_TEXT,
    SCHEMA_TEXT,
    SMALL_INT,
    Case,
    field,
    stops,
)
from hypothesis import strategies as st
from server_proc import ServerProcess, released
from smg_grpc_proto import trtllm_service_pb2 as tpb
from smg_grpc_proto import trtllm_service_pb2_grpc as tpb_grpc
from test_faults_fuzz import log_errors

from clients.client import AsyncClient

BATCH = 48
EXAMPLES = 20
SERVICE = "/trtllm.TrtllmService/"
CTX = 256
# one TensorRT-LLM pod with a small queue, so concurrent cases also meet admission control
FLEET = {"server": {"time_scale": 0.05}, "deployments": [
    {"name": "tiny", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
     "engine": "tensorrt-llm", "max_num_seqs": 2, "max_waiting": 3, "max_model_len": CTX}]}
POD = ("--deployment", "tiny", "--grpc-api", "trtllm")
GUIDE = tpb.GuidedDecodingParams
PLAUSIBLE = {  # values TensorRT-LLM accepts: most requests run, so cancels meet streams
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(0, 50),
    "min_p": st.floats(0, 1), "repetition_penalty": st.floats(0.5, 2),
    "num_return_sequences": st.integers(0, 3), "seed": st.integers(0, 2**64 - 1),
}


@st.composite
def sampling(draw) -> tpb.SamplingConfig:
    if draw(st.booleans()):
        return tpb.SamplingConfig(**draw(st.fixed_dictionaries({}, optional=PLAUSIBLE)))
    fields = {
        "beam_width": st.integers(-2, 3), "num_return_sequences": st.integers(0, 3),
        "top_k": SMALL_INT, "top_p": FLOAT, "temperature": FLOAT, "min_p": FLOAT,
        "min_tokens": st.integers(0, 2**32 - 1), "repetition_penalty": FLOAT,
        "presence_penalty": FLOAT, "frequency_penalty": FLOAT, "length_penalty": FLOAT,
        "early_stopping": SMALL_INT, "no_repeat_ngram_size": SMALL_INT,
        "beam_width_array": st.lists(st.integers(0, 3), max_size=2),
    }
    return tpb.SamplingConfig(**draw(st.fixed_dictionaries({}, optional=fields)))


@st.composite
def generate(draw) -> tpb.GenerateRequest:
    rid = draw(st.one_of(st.just(""), st.sampled_from(ID_POOL), REQUEST_ID))
    max_tokens = draw(st.one_of(st.integers(1, 16), st.integers(0, 16),
                                st.sampled_from((CTX, 2**32 - 1))))
    req = tpb.GenerateRequest(request_id=rid, sampling_config=draw(sampling()),
                              max_tokens=max_tokens, streaming=draw(st.booleans()),
                              ignore_eos=draw(st.booleans()),
                              include_stop_token_in_output=draw(st.booleans()))
    if draw(st.integers(0, 9)):  # 1 in 10 has no tokenized input
        req.tokenized.input_token_ids.extend(draw(st.one_of(
            st.lists(st.integers(0, 32_767), min_size=1, max_size=40),
            st.lists(st.one_of(st.integers(0, 32_767), st.integers(0, 2**32 - 1)),
                     max_size=CTX + 10))))
        req.tokenized.original_text = draw(SAFE_TEXT)
    if draw(st.booleans()):
        req.stop.extend(draw(stops()))
    req.stop_token_ids.extend(draw(st.lists(st.integers(0, 2**32 - 1), max_size=3)))
    if draw(st.booleans()):
        req.output_config.logprobs = draw(st.one_of(st.integers(0, 5), SMALL_INT))
    kind = draw(st.sampled_from((None, None, GUIDE.GUIDE_TYPE_JSON, GUIDE.GUIDE_TYPE_JSON_SCHEMA,
                                 GUIDE.GUIDE_TYPE_REGEX, GUIDE.GUIDE_TYPE_EBNF_GRAMMAR,
                                 GUIDE.GUIDE_TYPE_STRUCTURAL_TAG, GUIDE.GUIDE_TYPE_UNSPECIFIED)))
    if kind is not None:
        text = draw(SCHEMA_TEXT) if kind == GUIDE.GUIDE_TYPE_JSON_SCHEMA else draw(
            st.one_of(SAFE_TEXT, st.just("[a-z]{1,5}")))
        req.guided_decoding.CopyFrom(tpb.GuidedDecodingParams(guide_type=kind, guide=text))
    extra = draw(st.integers(0, 19))
    if extra == 0:
        req.lora_config.task_id = draw(st.integers(0, 3))
    elif extra == 1:
        req.disaggregated_params.request_type = draw(st.integers(0, 2))
    elif extra == 2:
        req.output_config.prompt_logprobs = draw(st.integers(0, 2))
    elif extra == 3:
        req.embedding_bias.extend([0.5, 1.0])
    elif extra == 4:
        req.multimodal_input.image_data.append(b"\x89PNG")
    elif extra == 5:
        req.output_config.return_generation_logits = True
    elif extra == 6:
        req.bad.append(draw(SAFE_TEXT))
    return req


UNARY = ("HealthCheck", "Abort", "GetModelInfo", "GetServerInfo", "Embed")


@st.composite
def case(draw) -> Case:
    pick = draw(st.integers(0, 99))
    if pick < 60:
        return Case("generate", draw(generate()), draw(ACTION))
    if pick < 75:  # invalid UTF-8 in the request id, the original text, a stop, a guide
        path = draw(st.sampled_from(((1,), (2, 1), (21,), (11, 2))))
        inner = field(path[-1], draw(BAD_UTF8))
        for number in reversed(path[:-1]):
            inner = field(number, inner)
        start = draw(generate()).SerializeToString()
        return Case("raw", (SERVICE + "Generate", start + inner), draw(ACTION))
    if pick < 88:
        return Case("unary", (SERVICE + draw(st.sampled_from(UNARY)),
                              draw(st.binary(max_size=16))))
    return Case("abort", draw(REQUEST_ID))


async def _finish(call, action: str) -> None:
    async for _ in call:
        if action == "cancel":
            call.cancel()
            break


async def run_case(stub, channel, k: Case) -> tuple[object, frozenset]:
    allowed = allowed_grpc(TRTLLM_SERVICE, k.action)
    timeout = DEADLINE if k.action == "deadline" else READ_TIMEOUT
    try:
        if k.kind == "generate":
            await _finish(stub.Generate(k.payload, timeout=timeout), k.action)
        elif k.kind == "raw":
            method, data = k.payload
            await _finish(channel.unary_stream(method)(data, timeout=timeout), k.action)
        elif k.kind == "unary":
            method, data = k.payload
            await channel.unary_unary(method)(data, timeout=READ_TIMEOUT)
        else:
            await stub.Abort(tpb.AbortRequest(request_id=k.payload), timeout=READ_TIMEOUT)
        return grpc.StatusCode.OK, allowed
    except grpc.aio.AioRpcError as e:
        if k.action == "cancel" and e.code() is grpc.StatusCode.CANCELLED:
            return grpc.StatusCode.OK, allowed
        return (e.code(), e.details()), allowed


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(FLEET, *POD) as s:
        yield s


def test_fuzz_trtllm_service_answers_only_documented_statuses(pod):
    loop = LoopThread()
    channel = stub = None

    async def connect() -> None:
        nonlocal channel, stub
        channel = grpc.aio.insecure_channel(pod.target,
                                            options=[("grpc.max_send_message_length", -1)])
        stub = tpb_grpc.TrtllmServiceStub(channel)

    async def run(cases: list[Case]) -> list[tuple[Case, object]]:
        results = await asyncio.gather(*(run_case(stub, channel, k) for k in cases))
        return [(k, answer) for k, (answer, allowed) in zip(cases, results, strict=True)
                if status_of(answer) not in allowed]

    try:
        loop.run(connect())
        assert run_batches(loop, run, case(), EXAMPLES, BATCH) >= 900
        loop.run(assert_idle(pod))
    finally:
        if channel is not None:
            loop.run(channel.close())
        loop.stop()
    assert not (errors := log_errors(pod.log)), "\n".join(errors)


async def assert_idle(pod: ServerProcess) -> None:
    async with AsyncClient(pod.target) as client:
        await released(client, (await client.list_deployments()).deployments[0].name,
                       timeout=30)
    # no front end still holds a pooled id in flight; asked from a new connection, which the
    # fuzzer's remembered Aborts (an Abort that may precede its Generate) do not reach
    own = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(pod.target, options=own) as channel:
        stub = tpb_grpc.TrtllmServiceStub(channel)
        for rid in ID_POOL:
            msgs = [m async for m in stub.Generate(tpb.GenerateRequest(
                request_id=rid, tokenized=tpb.TokenizedInput(input_token_ids=[1, 2, 3]),
                max_tokens=1))]
            assert msgs[-1].complete.completion_tokens == 1
