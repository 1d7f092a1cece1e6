"""The TensorRT-LLM pod's gRPC service (`trtllm.TrtllmService`) fuzzed as the SGLang pod's
scheduler is (`fuzz_env.fuzz_service`, which states the properties: documented statuses only,
no hang, an idle pod and a clean log afterwards), with TensorRT-LLM's own odd inputs: beam
widths, `num_return_sequences`, `max_tokens` of zero or around the context, guides of every
type (structural tags refused), logprob counts, and each field this pod does not serve (LoRA,
disaggregated parameters, prompt logprobs, embedding bias, images, logits, bad words); invalid
UTF-8 in the request id, the text, a stop and a guide — and, concurrently, its HTTP door
(`--http-api trtllm --enable-metrics`: trtllm-serve's OpenAI routes with odd bodies and bodies
that are not JSON, `/health_generate`, the iteration-stats `/metrics`, `/prometheus/metrics`,
`/v1/models`, `/version`, `/perf_metrics`, `/kv_cache_events` draining live KV events,
`/server_info`). 960 cases, derandomized."""

from __future__ import annotations

import json

import pytest
from documented import TRTLLM_SERVICE, allowed_http
from fuzz_env import fuzz_service, run_http_case, run_service_case
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
    http_body,
    stops,
)
from hypothesis import strategies as st
from server_proc import ServerProcess
from smg_grpc_proto import trtllm_service_pb2 as tpb
from smg_grpc_proto import trtllm_service_pb2_grpc as tpb_grpc
from test_faults_fuzz import log_errors

BATCH = 48
EXAMPLES = 20
SERVICE = "/trtllm.TrtllmService/"
CTX = 256
# one TensorRT-LLM pod with a small queue, so concurrent cases also meet admission control
FLEET = {"server": {"time_scale": 0.05}, "deployments": [
    {"name": "tiny", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
     "engine": "tensorrt-llm", "max_num_seqs": 2, "max_waiting": 3, "max_model_len": CTX}]}
POD = ("--deployment", "tiny", "--http-api", "trtllm", "--enable-metrics",  # KV events on:
       "--kv-events-config",  # POST /kv_cache_events drains them while requests run
       '{"enable_kv_cache_events": true, "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0"}')
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


HTTP_ROUTES = ("/v1/completions", "/v1/completions", "/v1/chat/completions", "/health_generate",
               "/metrics", "/prometheus/metrics", "/v1/models", "/version", "/perf_metrics",
               "/kv_cache_events", "/server_info")


@st.composite
def http_case(draw) -> Case:
    route = draw(st.sampled_from(HTTP_ROUTES))
    if route == "/kv_cache_events":
        return Case("http", ("POST", route, draw(st.binary(max_size=16))), "read")
    if not route.startswith("/v1/c"):
        return Case("http", ("GET", route, b""), "read")
    data = draw(st.one_of(st.builds(lambda b: json.dumps(b).encode(), http_body(route)),
                          st.just(b"{not json"), st.just(b"\xff\xfe")))
    return Case("http", ("POST", route, data), draw(st.sampled_from(("read", "read", "cancel"))))


@st.composite
def case(draw) -> Case:
    pick = draw(st.integers(0, 99))
    if pick < 20:
        return draw(http_case())
    if pick < 65:
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


async def run_case(stub, channel, http, k: Case) -> tuple[object, frozenset]:
    if k.kind == "http":
        # /health_generate answers 500 when its one-token generation is refused (a full queue)
        extra = {500} if k.payload[1] == "/health_generate" else set()
        return await run_http_case(http, k), allowed_http() | extra
    return await run_service_case(stub, channel, k, TRTLLM_SERVICE,
                                  lambda rid: tpb.AbortRequest(request_id=rid))


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(FLEET, *POD) as s:
        yield s


def test_fuzz_trtllm_service_answers_only_documented_statuses(pod):
    def one_token(rid: str) -> tpb.GenerateRequest:
        return tpb.GenerateRequest(request_id=rid, max_tokens=1,
                                   tokenized=tpb.TokenizedInput(input_token_ids=[1, 2, 3]))

    assert fuzz_service(pod, tpb_grpc.TrtllmServiceStub, run_case, case(), one_token,
                        EXAMPLES, BATCH, http=True) >= 900
    assert not (errors := log_errors(pod.log)), "\n".join(errors)
