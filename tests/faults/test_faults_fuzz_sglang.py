"""A property-based fuzzer over an SGLang pod, as `test_faults_fuzz.py` is over a vLLM one:
its gRPC scheduler service (`sglang.grpc.scheduler.SglangScheduler`) — random GenerateRequests
(odd sampling values, NaN and infinities, huge stop lists, constraints, n, logprobs, ranks,
unserved fields), invalid UTF-8 written on the wire by hand, random bytes to every method,
Aborts and load queries, ended by reading, a cancel or a 50 ms deadline — and its HTTP server
(SGLang's `/generate` with odd `GenerateReqInput` bodies, the OpenAI routes, `/abort_request`,
`/flush_cache`, `/v1/loads`, bodies that are not JSON), concurrently (ids drawn from a small
pool collide).

Properties, over 960 cases (20 examples of 48, derandomized): every answer is a status the
servicer documents that a serving pod may give (`documented.py`), no read hangs; afterwards the
pod is idle (nothing running or waiting, every KV block free), every pooled id is free again,
and its log holds no error or traceback.
"""

from __future__ import annotations

import json

import pytest
from documented import SGLANG_SCHEDULER, allowed_http
from fuzz_env import READ_TIMEOUT, fuzz_service, run_http_case, run_service_case
from fuzz_strategies import (
    ACTION,
    BAD_UTF8,
    FLOAT,
    ID_POOL,
    JSON_VALUE,
    PROMPT_TEXT,
    REQUEST_ID,
    SAFE_TEXT,
    SCHEMA_TEXT,
    SMALL_INT,
    TOKEN_IDS,
    Case,
    field,
    http_body,
    stops,
)
from hypothesis import strategies as st
from server_proc import ServerProcess
from smg_grpc_proto import sglang_scheduler_pb2 as spb
from smg_grpc_proto import sglang_scheduler_pb2_grpc as spb_grpc
from test_faults_fuzz import log_errors

BATCH = 48
EXAMPLES = 20
SERVICE = "/sglang.grpc.scheduler.SglangScheduler/"
# one SGLang pod with a small queue, so concurrent cases also meet admission control
FLEET = {"server": {"time_scale": 0.05}, "deployments": [
    {"name": "tiny", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
     "engine": "sglang", "max_num_seqs": 2, "max_waiting": 3, "max_model_len": 256}]}
POD = ("--deployment", "tiny", "--http-api", "sglang")
UINT32 = st.one_of(st.integers(0, 300), st.sampled_from((2**31 - 1, 2**32 - 1)))


PLAUSIBLE = {  # values SGLang accepts: most requests run, so cancels and deadlines meet streams
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(-1, 50),
    "min_p": st.floats(0, 1), "repetition_penalty": st.floats(0, 2),
    "max_new_tokens": st.integers(1, 16), "n": st.integers(0, 3),
    "stop": st.lists(SAFE_TEXT, max_size=2), "ignore_eos": st.booleans(),
}


@st.composite
def sampling(draw) -> spb.SamplingParams:
    if draw(st.booleans()):
        return spb.SamplingParams(**draw(st.fixed_dictionaries({}, optional=PLAUSIBLE)))
    fields = {
        "temperature": FLOAT, "top_p": FLOAT, "top_k": SMALL_INT, "min_p": FLOAT,
        "frequency_penalty": FLOAT, "presence_penalty": FLOAT, "repetition_penalty": FLOAT,
        "max_new_tokens": UINT32, "min_new_tokens": UINT32, "n": st.integers(0, 3),
        "stop": stops(), "stop_token_ids": st.lists(st.integers(0, 2**32 - 1), max_size=3),
        "ignore_eos": st.booleans(), "no_stop_trim": st.booleans(),
        "skip_special_tokens": st.booleans(), "stream_interval": SMALL_INT,
        "logit_bias": st.dictionaries(SAFE_TEXT, FLOAT, max_size=2),
    }
    kw = draw(st.fixed_dictionaries({}, optional=fields))
    sp = spb.SamplingParams(**kw)
    if draw(st.integers(0, 3)) == 0:  # most end in milliseconds
        pass
    elif not sp.HasField("max_new_tokens") or sp.max_new_tokens > 16:
        sp.max_new_tokens = 16
    kind = draw(st.sampled_from((None, None, "regex", "json_schema", "ebnf_grammar",
                                 "structural_tag")))
    if kind == "json_schema":
        sp.json_schema = draw(SCHEMA_TEXT)
    elif kind is not None:
        setattr(sp, kind, draw(st.one_of(SAFE_TEXT, st.just("[a-z]{1,5}"))))
    return sp


@st.composite
def generate(draw) -> spb.GenerateRequest:
    rid = draw(st.one_of(st.just(""), st.sampled_from(ID_POOL), REQUEST_ID))
    req = spb.GenerateRequest(request_id=rid, sampling_params=draw(sampling()),
                              stream=draw(st.booleans()), return_logprob=draw(st.booleans()),
                              top_logprobs_num=draw(st.one_of(st.integers(0, 5), SMALL_INT)),
                              logprob_start_len=draw(st.sampled_from((-1, -1, -1, 0, 5))))
    if draw(st.integers(0, 9)):  # 1 in 10 has no tokenized input
        req.tokenized.input_ids.extend(draw(st.one_of(
            st.lists(st.integers(0, 32_767), min_size=1, max_size=40),
            st.lists(st.one_of(st.integers(0, 32_767), st.integers(0, 2**32 - 1)),
                     max_size=300))))
        req.tokenized.original_text = draw(SAFE_TEXT)
    extra = draw(st.integers(0, 19))
    if extra == 0:
        req.data_parallel_rank = draw(st.integers(-2, 2))
    elif extra == 1:
        req.lora_id = draw(SAFE_TEXT)
    elif extra == 2:
        req.return_hidden_states = True
    elif extra == 3:
        req.token_ids_logprob.extend([1, 2])
    elif extra == 4:
        req.disaggregated_params.bootstrap_room = 1
    elif extra == 5:
        req.input_embeds.extend([0.5, 1.0])
    return req


UNARY = ("HealthCheck", "Abort", "GetModelInfo", "GetServerInfo", "GetLoads", "FlushCache",
         "Embed", "StartProfile", "StopProfile", "LoadLoRAAdapter", "UnloadLoRAAdapter",
         "ListLoadedLoRAAdapters")


@st.composite
def native_generate(draw) -> dict:
    """A body for SGLang's HTTP `/generate` (`GenerateReqInput`), odd values included."""
    sampling = st.fixed_dictionaries({}, optional={
        "max_new_tokens": st.one_of(st.integers(-3, 16), JSON_VALUE), "temperature": FLOAT,
        "top_p": FLOAT, "top_k": SMALL_INT, "min_new_tokens": SMALL_INT,
        "n": st.integers(-1, 3), "stop": st.one_of(stops(), JSON_VALUE),
        "stop_token_ids": st.one_of(TOKEN_IDS, JSON_VALUE), "ignore_eos": st.booleans(),
        "json_schema": SCHEMA_TEXT, "regex": SAFE_TEXT, "sampling_seed": JSON_VALUE,
        "bogus": JSON_VALUE})
    fields = {
        "text": st.one_of(SAFE_TEXT, st.lists(SAFE_TEXT, max_size=3), JSON_VALUE, PROMPT_TEXT),
        "input_ids": st.one_of(TOKEN_IDS, st.lists(TOKEN_IDS, max_size=2), JSON_VALUE),
        "sampling_params": st.one_of(sampling, st.lists(sampling, max_size=2), JSON_VALUE),
        "rid": st.one_of(REQUEST_ID, st.lists(SAFE_TEXT, max_size=3), JSON_VALUE),
        "stream": st.booleans(), "return_logprob": st.one_of(st.booleans(), JSON_VALUE),
        "top_logprobs_num": st.one_of(st.integers(-2, 30), JSON_VALUE)}
    if draw(st.booleans()):  # one odd field in a valid body, so its own check is reached
        key = draw(st.sampled_from(sorted(fields)))
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 4}, "return_logprob": True,
                key: draw(fields[key])}
        if key == "input_ids":
            del body["text"]
    else:
        body = draw(st.fixed_dictionaries({}, optional=fields))
    if isinstance(body.get("sampling_params"), dict):  # most end in milliseconds
        body["sampling_params"].setdefault("max_new_tokens", 8)
    return body


HTTP_ROUTES = ("/generate", "/generate", "/generate", "/v1/completions",
               "/v1/chat/completions", "/abort_request", "/flush_cache", "/v1/loads",
               "/health_generate", "/server_info", "/model_info", "/encode")


@st.composite
def http_case(draw) -> Case:
    route = draw(st.sampled_from(HTTP_ROUTES))
    if route in ("/generate", "/encode"):
        body: object = draw(native_generate())
    elif route in ("/v1/completions", "/v1/chat/completions"):
        body = draw(http_body(route))
    elif route == "/v1/loads":
        include = draw(st.sampled_from(("", "core", "all", "memory,queues", "gpu")))
        route += f"?include={include}&dp_rank={draw(st.integers(-1, 1))}"
        return Case("http", ("GET", route, b""), "read")
    elif route in ("/health_generate", "/server_info", "/model_info"):
        return Case("http", ("GET", route, b""), "read")
    else:
        body = draw(st.one_of(st.fixed_dictionaries({}, optional={
            "rid": REQUEST_ID, "abort_all": st.booleans()}), JSON_VALUE))
    data = draw(st.one_of(st.just(json.dumps(body).encode()), st.just(b"{not json"),
                          st.just(b"\xff\xfe")))
    return Case("http", ("POST", route, data), draw(st.sampled_from(("read", "read", "cancel"))))


@st.composite
def case(draw) -> Case:
    pick = draw(st.integers(0, 99))
    if pick < 25:
        return draw(http_case())
    if pick < 60:
        return Case("generate", draw(generate()), draw(ACTION))
    if pick < 72:  # invalid UTF-8 in the request id, the original text, a stop, a regex
        path = draw(st.sampled_from(((1,), (2, 1), (4, 9), (4, 13))))
        inner = field(path[-1], draw(BAD_UTF8))
        for number in reversed(path[:-1]):
            inner = field(number, inner)
        start = draw(generate()).SerializeToString()
        return Case("raw", (SERVICE + "Generate", start + inner), draw(ACTION))
    if pick < 82:
        return Case("unary", (SERVICE + draw(st.sampled_from(UNARY)),
                              draw(st.binary(max_size=16))))
    if pick < 90:
        return Case("abort", draw(REQUEST_ID))
    return Case("loads", spb.GetLoadsRequest(
        include=draw(st.lists(st.sampled_from(("core", "memory", "all", "queues", "gpu", "")),
                              max_size=3)),
        **({"dp_rank": draw(st.integers(-1, 2))} if draw(st.booleans()) else {})))


async def run_case(stub, channel, http, k: Case) -> tuple[object, frozenset]:
    if k.kind == "http":
        # /health_generate answers 503 when its one-token generation is refused (a full queue)
        extra = {503} if k.payload[1] == "/health_generate" else set()
        return await run_http_case(http, k), allowed_http() | extra
    return await run_service_case(
        stub, channel, k, SGLANG_SCHEDULER, lambda rid: spb.AbortRequest(request_id=rid),
        other=lambda stub, k: stub.GetLoads(k.payload, timeout=READ_TIMEOUT))


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(FLEET, *POD) as s:
        yield s


def test_fuzz_sglang_scheduler_answers_only_documented_statuses(pod):
    def one_token(rid: str) -> spb.GenerateRequest:
        return spb.GenerateRequest(
            request_id=rid, tokenized=spb.TokenizedInput(input_ids=[1, 2, 3]),
            sampling_params=spb.SamplingParams(temperature=1.0, max_new_tokens=1))

    assert fuzz_service(pod, spb_grpc.SglangSchedulerStub, run_case, case(), one_token,
                        EXAMPLES, BATCH, http=True) >= 900
    assert not (errors := log_errors(pod.log)), "\n".join(errors)
