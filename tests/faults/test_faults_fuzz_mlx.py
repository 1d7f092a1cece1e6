"""The MLX pod's gRPC service (`mlx.grpc.engine.MlxEngine`, `--grpc-api mlx`) fuzzed as the
TensorRT-LLM pod's is (`fuzz_env.fuzz_service`, which states the properties: documented
statuses only, no hang, an idle pod and a clean log afterwards), with MLX's own odd inputs:
`text` input or none where tokens are required, empty and over-long prompts, `max_tokens`
unset, zero or past the context, every sampling field unset or out of range, stop token ids
past the vocabulary, `ignore_eos`, logprob counts of every sign, `logit_bias`, seeds; invalid
UTF-8 in the request id, the text input and the original text; Aborts of several ids at once.
960 cases, derandomized."""

from __future__ import annotations

import pytest
from documented import MLX_ENGINE
from fuzz_env import fuzz_service, run_service_case
from fuzz_strategies import (
    ACTION,
    BAD_UTF8,
    FLOAT,
    ID_POOL,
    REQUEST_ID,
    SAFE_TEXT,
    SMALL_INT,
    Case,
    field,
)
from hypothesis import strategies as st
from server_proc import ServerProcess
from smg_grpc_proto import mlx_engine_pb2 as mpb
from smg_grpc_proto import mlx_engine_pb2_grpc as mpb_grpc
from test_faults_fuzz import log_errors

BATCH = 48
EXAMPLES = 20
SERVICE = "/mlx.grpc.engine.MlxEngine/"
CTX = 256
# one MLX pod with a small queue, so concurrent cases also meet admission control
FLEET = {"server": {"time_scale": 0.05}, "deployments": [
    {"name": "tiny", "model": "llama-3.1-8b", "quant": "mlx-4bit", "chip": "m4-max-40",
     "engine": "mlx", "max_num_seqs": 2, "max_waiting": 3, "max_model_len": CTX}]}
POD = ("--deployment", "tiny", "--grpc-api", "mlx")
PLAUSIBLE = {  # values MLX accepts: most requests run, so cancels meet streams
    "temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "top_k": st.integers(0, 50),
    "min_p": st.floats(0, 1), "repetition_penalty": st.floats(0, 2),
    "seed": st.integers(-2**31, 2**31 - 1), "ignore_eos": st.booleans(),
}


@st.composite
def sampling(draw) -> mpb.SamplingParams:
    if draw(st.booleans()):
        sp = mpb.SamplingParams(**draw(st.fixed_dictionaries({}, optional=PLAUSIBLE)))
    else:
        fields = {
            "temperature": FLOAT, "top_p": FLOAT, "top_k": st.integers(0, 2**32 - 1),
            "min_p": FLOAT, "repetition_penalty": FLOAT, "frequency_penalty": FLOAT,
            "presence_penalty": FLOAT, "logprobs": SMALL_INT,
            "seed": st.integers(-2**31, 2**31 - 1), "ignore_eos": st.booleans(),
        }
        sp = mpb.SamplingParams(**draw(st.fixed_dictionaries({}, optional=fields)))
    max_tokens = draw(st.one_of(st.none(), st.integers(1, 16), st.integers(0, 16),
                                st.sampled_from((CTX, 2**32 - 1))))
    if max_tokens is not None:
        sp.max_tokens = max_tokens
    sp.stop_token_ids.extend(draw(st.lists(st.integers(0, 2**32 - 1), max_size=3)))
    if draw(st.booleans()):
        sp.logprobs = draw(st.one_of(st.integers(-2, 5), SMALL_INT))
    if not draw(st.integers(0, 9)):  # 1 in 10 biases logits (not emulated)
        sp.logit_bias[draw(st.integers(-5, 40_000))] = draw(FLOAT)
    return sp


@st.composite
def generate(draw) -> mpb.GenerateRequest:
    rid = draw(st.one_of(st.just(""), st.sampled_from(ID_POOL), REQUEST_ID))
    req = mpb.GenerateRequest(request_id=rid, sampling_params=draw(sampling()),
                              stream=draw(st.booleans()))
    kind = draw(st.integers(0, 9))
    if kind == 0:  # text input: refused, as smg's MLX servicer does
        req.text = draw(SAFE_TEXT)
    elif kind > 1:  # 1 in 10 has no input at all
        req.tokenized.input_ids.extend(draw(st.one_of(
            st.lists(st.integers(0, 32_767), min_size=1, max_size=40),
            st.lists(st.one_of(st.integers(0, 32_767), st.integers(0, 2**32 - 1)),
                     max_size=CTX + 10))))
        req.tokenized.original_text = draw(SAFE_TEXT)
    return req


UNARY = ("HealthCheck", "Abort", "GetModelInfo", "GetServerInfo")


@st.composite
def case(draw) -> Case:
    pick = draw(st.integers(0, 99))
    if pick < 60:
        return Case("generate", draw(generate()), draw(ACTION))
    if pick < 72:  # invalid UTF-8 in the request id, the text input, the original text
        path = draw(st.sampled_from(((1,), (3,), (2, 1))))
        inner = field(path[-1], draw(BAD_UTF8))
        for number in reversed(path[:-1]):
            inner = field(number, inner)
        start = draw(generate()).SerializeToString()
        return Case("raw", (SERVICE + "Generate", start + inner), draw(ACTION))
    if pick < 85:
        return Case("unary", (SERVICE + draw(st.sampled_from(UNARY)),
                              draw(st.binary(max_size=16))))
    return Case("abort", draw(st.lists(REQUEST_ID, min_size=1, max_size=3)))


async def run_case(stub, channel, http, k: Case) -> tuple[object, frozenset]:
    return await run_service_case(stub, channel, k, MLX_ENGINE,
                                  lambda rids: mpb.AbortRequest(request_ids=rids))


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(FLEET, *POD) as s:
        yield s


def test_fuzz_mlx_engine_answers_only_documented_statuses(pod):
    def one_token(rid: str) -> mpb.GenerateRequest:
        return mpb.GenerateRequest(
            request_id=rid, tokenized=mpb.TokenizedInput(input_ids=[1, 2, 3]),
            sampling_params=mpb.SamplingParams(max_tokens=1))

    assert fuzz_service(pod, mpb_grpc.MlxEngineStub, run_case, case(), one_token,
                        EXAMPLES, BATCH) >= 900
    assert not (errors := log_errors(pod.log)), "\n".join(errors)
