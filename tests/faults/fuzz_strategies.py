"""Hypothesis strategies for the fuzzer: one `Case` is one call to the running server.

What is covered, on purpose (issue 14's findings): raw invalid UTF-8 in string fields on the
wire (protobuf bytes written by hand and sent with no serializer), control characters and
huge request ids, ids reused from a small pool (so concurrent cases collide), NaN and
infinities, deep and huge JSON schemas, messages above grpc's 4 MiB limit, thousands of stop
strings, odd sampling values, unknown deployments and models, unimplemented methods, and
HTTP bodies that are not JSON, not UTF-8, nested 100,000 deep or of the wrong types. Rare
expensive cases (megabytes) are drawn 1 in ~40 by an integer selector.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from smg_grpc_proto import vllm_engine_pb2 as vpb

from doppelchip.v1 import inference_pb2 as pb

ID_POOL = ("dup-0", "dup-1", "dup-2", "dup-3")
DEPLOYMENTS = ("fast", "tiny", "embed", "rerank")
MODEL = "llama-3.1-8b"
EMBED_MODEL = "qwen3-embedding-0.6b"  # the fuzz fleet's embedding model (docs/EMBEDDINGS.md)
RERANK_MODEL = "qwen3-reranker-0.6b"  # and its cross-encoder (converted by --hf-overrides)
POOLING_ROUTES = ("/v1/embeddings", "/pooling", "/score", "/rerank", "/v2/embed", "/classify")
INT32 = (-(2**31), 2**31 - 1)


@dataclass(frozen=True)
class Case:
    """One call: `kind` says where (inference, vllm, raw, unary, http), `payload` what,
    `action` how the client ends it (read everything, cancel after the first message, or a
    50 ms deadline)."""

    kind: str
    payload: Any
    action: str = "read"

    def __repr__(self) -> str:  # short: a failing batch lists dozens of cases
        text = repr(self.payload)
        return f"Case({self.kind}, {self.action}, {text[:300]}{'…' if len(text) > 300 else ''})"


# ---- building blocks ----------------------------------------------------------------------
SAFE_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=24)
CONTROL = st.text(st.characters(min_codepoint=0, max_codepoint=0x9F,
                                blacklist_categories=("Cs",)), min_size=1, max_size=8)
REQUEST_ID = st.one_of(
    st.just(""), st.sampled_from(ID_POOL), SAFE_TEXT,
    st.builds(lambda a, c, b: a + c + b, SAFE_TEXT, CONTROL, SAFE_TEXT),
    st.integers(250, 270).map(lambda n: "i" * n), st.just("é" * 129), st.just("üñí©ødé-1"),
    st.integers(0, 39).map(lambda k: "x" * (10_000 if k else 1_000_000)),
)
DEPLOYMENT = st.one_of(st.just(""), st.sampled_from(DEPLOYMENTS), SAFE_TEXT, CONTROL)
FLOAT = st.one_of(st.floats(width=32), st.sampled_from(
    (float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, 2.0, 1e-30, 1e30)))
SMALL_INT = st.one_of(st.integers(-3, 300), st.sampled_from(INT32))


def stops() -> st.SearchStrategy[list[str]]:
    return st.one_of(
        st.lists(SAFE_TEXT, max_size=4),
        st.integers(250, 3000).map(lambda n: [f"s{i}" for i in range(n)]),
        st.integers(1000, 1100).map(lambda n: ["y" * n]),
        st.just(["x" * 700] * 300),
    )


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


SCHEMA_TEXT = st.one_of(
    st.integers(1, 400).map(lambda d: json.dumps(_nested(d))),
    st.integers(1, 3000).map(lambda n: json.dumps(
        {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}})),
    st.just('{"type": "object"}'), st.just("{not json"), SAFE_TEXT,
    st.just(json.dumps({"type": "array", "items": {"$ref": "#"}})),
)


def _sampling(cls: type) -> st.SearchStrategy:
    fields = {
        "max_tokens": st.one_of(st.integers(-3, 300), st.sampled_from((0, INT32[1]))),
        "min_tokens": SMALL_INT, "temperature": FLOAT, "top_p": FLOAT, "top_k": SMALL_INT,
        "min_p": FLOAT, "repetition_penalty": FLOAT, "presence_penalty": FLOAT,
        "frequency_penalty": FLOAT, "seed": st.integers(0, 2**63 - 1),
        "ignore_eos": st.booleans(), "stop": stops(),
        "stop_token_ids": st.lists(st.integers(0, 2**32 - 1), max_size=3),
    }
    if cls is pb.SamplingParams:
        fields["n"] = st.integers(-1, 5)
        fields["logprobs"] = st.integers(0, 2)
    else:
        fields["n"] = st.integers(0, 3)
        fields["top_k"] = st.integers(0, 2**32 - 1)
        fields["max_tokens"] = st.integers(0, 300)
        fields["min_tokens"] = st.integers(0, 300)
        fields["seed"] = st.integers(*INT32)
    keys = sorted(fields)
    return st.fixed_dictionaries({}, optional={k: fields[k] for k in keys}).map(
        lambda kw: cls(**kw))


def _with_min_max(sp):
    """Most requests keep a small max_tokens so generations end in milliseconds."""
    if not sp.HasField("max_tokens") and sp.max_tokens == 0:
        sp.max_tokens = 16
    return sp


PROMPT_TEXT = st.one_of(SAFE_TEXT, st.just(""), st.integers(0, 39).map(
    lambda k: "長" * (60_000 if k else 2_000_000)))
TOKEN_IDS = st.lists(st.one_of(st.integers(0, 128_255), st.integers(0, 2**32 - 1)),
                     max_size=20)


@st.composite
def inference_request(draw) -> pb.GenerateRequest:
    req = pb.GenerateRequest(request_id=draw(REQUEST_ID), deployment=draw(DEPLOYMENT),
                             model=draw(st.one_of(st.just(""), st.just(MODEL), SAFE_TEXT)),
                             priority=draw(st.one_of(st.just(0), st.sampled_from(INT32))),
                             return_token_times=draw(st.booleans()))
    if draw(st.booleans()):
        req.text = draw(PROMPT_TEXT)
    else:
        req.token_ids.ids.extend(draw(TOKEN_IDS))
    req.sampling.CopyFrom(_with_min_max(draw(_sampling(pb.SamplingParams))))
    kind = draw(st.sampled_from((None, None, "regex", "json_schema", "choice", "grammar")))
    if kind == "json_schema":
        req.constraint.json_schema = draw(SCHEMA_TEXT)
    elif kind == "choice":
        req.constraint.choice.SetInParent()
        req.constraint.choice.choices.extend(draw(st.lists(SAFE_TEXT, max_size=4)))
    elif kind is not None:
        req.constraint.__setattr__(kind, draw(st.one_of(SAFE_TEXT, st.just("[a-z]{1,5}"),
                                                        st.just("(" * 5000))))
    return req


@st.composite
def vllm_request(draw) -> vpb.GenerateRequest:
    sp = draw(_sampling(vpb.SamplingParams))
    if sp.max_tokens == 0:
        sp.max_tokens = 16
    kind = draw(st.sampled_from((None, None, "regex", "json_schema", "grammar")))
    if kind == "json_schema":
        sp.json_schema = draw(SCHEMA_TEXT)
    elif kind is not None:
        setattr(sp, kind, draw(SAFE_TEXT))
    req = vpb.GenerateRequest(request_id=draw(REQUEST_ID), sampling_params=sp,
                              stream=draw(st.booleans()))
    if draw(st.booleans()):
        req.text = draw(PROMPT_TEXT)
    else:
        req.tokenized.input_ids.extend(draw(TOKEN_IDS))
    return req


# ---- raw bytes on the wire ----------------------------------------------------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field, written by hand (no UTF-8 check on the way)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


BAD_UTF8 = st.sampled_from((b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"a\x80b",
                            b"\xf4\x90\x80\x80", b"\xe2\x82"))
# (method, a valid message to start from, string fields by number path)
RAW_TARGETS = (
    ("/doppelchip.v1.Inference/Generate", "inference", ((1,), (2,), (3,), (4,), (6, 12),
                                                         (7, 2))),
    ("/vllm.grpc.engine.VllmEngine/Generate", "vllm", ((1,), (3,), (4, 9), (4, 24))),
    ("/doppelchip.v1.Inference/GetDeployment", None, ((1,),)),
    ("/vllm.grpc.engine.VllmEngine/Abort", None, ((1,),)),
)


@st.composite
def raw_case(draw) -> Case:
    method, base, paths = draw(st.sampled_from(RAW_TARGETS))
    start = b""
    if base == "inference":
        start = draw(inference_request()).SerializeToString()
    elif base == "vllm":
        start = draw(vllm_request()).SerializeToString()
    path = draw(st.sampled_from(paths))
    bad = draw(BAD_UTF8)
    inner = field(path[-1], bad)
    for number in reversed(path[:-1]):
        inner = field(number, inner)
    tail = draw(st.one_of(st.just(b""), st.binary(max_size=12)))
    return Case("raw", (method, start + inner + tail), draw(ACTION))


ACTION = st.sampled_from(("read", "read", "read", "cancel", "deadline"))
UNARY = st.sampled_from((
    "/doppelchip.v1.Inference/ListDeployments", "/doppelchip.v1.Inference/GetDeployment",
    "/vllm.grpc.engine.VllmEngine/HealthCheck", "/vllm.grpc.engine.VllmEngine/GetModelInfo",
    "/vllm.grpc.engine.VllmEngine/GetServerInfo", "/vllm.grpc.engine.VllmEngine/GetLoads",
    "/vllm.grpc.engine.VllmEngine/Abort", "/vllm.grpc.engine.VllmEngine/Embed",
    "/vllm.grpc.engine.VllmEngine/FlushCache", "/vllm.grpc.engine.VllmEngine/StartProfile",
    "/vllm.grpc.engine.VllmEngine/StopProfile",
))
STREAMING_OTHER = st.sampled_from(("/vllm.grpc.engine.VllmEngine/GetTokenizer",
                                   "/vllm.grpc.engine.VllmEngine/SubscribeKvEvents"))


# ---- HTTP -----------------------------------------------------------------------------------
JSON_VALUE = st.one_of(st.none(), st.booleans(), SMALL_INT, FLOAT, SAFE_TEXT,
                       st.lists(SMALL_INT, max_size=3))


@st.composite
def http_body(draw, route: str) -> dict:
    body: dict = {}
    if draw(st.integers(0, 9)):
        body["model"] = draw(st.one_of(st.just(MODEL), st.just("llama-3-8b"), SAFE_TEXT,
                                       JSON_VALUE))
    if route in POOLING_ROUTES:
        return _pooling_body(draw, route, body)
    if route == "/invocations":  # SageMaker's: a chat or a completions body
        route = draw(st.sampled_from(("/v1/chat/completions", "/v1/completions")))
    route = route.removesuffix("/render")  # vLLM's render: the route's own body
    if route == "/inference/v1/generate":  # token-in/token-out: ids and vLLM's SamplingParams
        body["token_ids"] = draw(st.one_of(TOKEN_IDS, JSON_VALUE))
        body["sampling_params"] = draw(st.one_of(st.fixed_dictionaries({}, optional={
            "max_tokens": st.one_of(st.integers(-3, 300), JSON_VALUE), "temperature": FLOAT,
            "n": st.integers(-1, 4), "logprobs": JSON_VALUE, "stop": stops(),
            "ignore_eos": st.booleans(), "seed": JSON_VALUE,
            "structured_outputs": st.sampled_from(({"choice": ["a", "b"]}, {"regex": "["},
                                                   {}))}), JSON_VALUE))
        body.update(draw(st.fixed_dictionaries({}, optional={
            "stream": st.booleans(), "return_token_ids": st.booleans(),
            "output_mode": st.sampled_from(("tokens", "text", "derender", "x")),
            "request_id": REQUEST_ID})))
        return body
    if route in ("/v1/chat/completions", "/v1/messages", "/v1/chat/completions/batch"):
        role = st.sampled_from(("user", "system", "assistant", "tool", "nobody"))
        conversation = st.lists(st.fixed_dictionaries({"role": role, "content": SAFE_TEXT}),
                                max_size=3)
        if route.endswith("/batch"):  # vLLM's batch chat: a list of conversations
            conversation = st.lists(st.one_of(conversation, JSON_VALUE), max_size=3)
        body["messages"] = draw(st.one_of(conversation, JSON_VALUE))
    elif route == "/v1/responses":
        item = st.one_of(
            st.fixed_dictionaries({"role": st.sampled_from(("user", "developer", "nobody")),
                                   "content": SAFE_TEXT}),
            st.fixed_dictionaries({"type": st.just("function_call_output"),
                                   "call_id": SAFE_TEXT, "output": SAFE_TEXT}),
            st.fixed_dictionaries({"type": st.just("function_call")}), JSON_VALUE)
        body["input"] = draw(st.one_of(SAFE_TEXT, st.lists(item, max_size=3), JSON_VALUE))
        body.update(draw(st.fixed_dictionaries({}, optional={
            "max_output_tokens": st.one_of(st.integers(-3, 300), JSON_VALUE),
            "instructions": st.one_of(SAFE_TEXT, JSON_VALUE),
            "text": st.sampled_from(({"format": {"type": "json_object"}},
                                     {"format": {"type": "json_schema", "name": "x",
                                                 "schema": {"type": "object"}}},
                                     {"format": {"type": "nothing"}})),
            "tools": st.sampled_from(([{"type": "function", "name": "f"}],
                                      [{"type": "web_search_preview"}], [])),
            "tool_choice": st.sampled_from(("auto", "required", "none", {"type": "x"})),
            "previous_response_id": SAFE_TEXT, "background": st.booleans(),
            "store": st.booleans(),
        })))
    elif route in ("/v1/completions", "/tokenize"):
        body["prompt"] = draw(st.one_of(SAFE_TEXT, TOKEN_IDS, st.lists(SAFE_TEXT, max_size=3),
                                        JSON_VALUE, PROMPT_TEXT))
    else:
        body["tokens"] = draw(st.one_of(TOKEN_IDS, JSON_VALUE))
    optional = {
        "max_tokens": st.one_of(st.integers(-3, 300), JSON_VALUE), "temperature": FLOAT,
        "top_p": FLOAT, "top_k": SMALL_INT, "min_tokens": SMALL_INT, "n": st.integers(-1, 4),
        "stop": st.one_of(stops(), JSON_VALUE), "stream": st.booleans(),
        "request_id": REQUEST_ID, "ignore_eos": st.booleans(), "seed": JSON_VALUE,
        "presence_penalty": FLOAT, "repetition_penalty": FLOAT, "logprobs": JSON_VALUE,
        "response_format": st.one_of(
            SCHEMA_TEXT.map(lambda s: {"type": "json_schema", "json_schema": {
                "name": "x", "schema": _loads(s)}}),
            st.just({"type": "json_object"}), JSON_VALUE),
        "priority": SMALL_INT,
    }
    body.update(draw(st.fixed_dictionaries({}, optional=optional)))
    if isinstance(body.get("max_tokens"), int) and not 0 < body["max_tokens"] <= 300:
        pass  # odd values stay: the server must refuse them
    elif "max_tokens" not in body:
        body["max_tokens"] = 16
    return body


def _pooling_body(draw, route: str, body: dict) -> dict:
    """A pooling model's request (mostly naming the embedding model or the cross-encoder),
    every field sometimes of a wrong type or value."""
    if draw(st.integers(0, 3)):
        body["model"] = draw(st.sampled_from((EMBED_MODEL, RERANK_MODEL)))
    texts = st.one_of(SAFE_TEXT, st.lists(SAFE_TEXT, max_size=3), JSON_VALUE, PROMPT_TEXT)
    if route in ("/v1/embeddings", "/pooling", "/classify"):
        body["input"] = draw(st.one_of(texts, TOKEN_IDS, st.lists(TOKEN_IDS, max_size=2)))
    elif route == "/score":
        body["queries"], body["documents"] = draw(texts), draw(texts)
    elif route == "/rerank":
        body["query"], body["documents"] = draw(texts), draw(texts)
    else:
        body["texts"] = draw(texts)
    body.update(draw(st.fixed_dictionaries({}, optional={
        "encoding_format": st.sampled_from(("float", "base64", "bytes", "bytes_only", "x")),
        "embed_dtype": st.sampled_from(("float16", "bfloat16", "fp8_e4m3", "int4")),
        "dimensions": st.one_of(st.integers(-2, 2000), JSON_VALUE),
        "output_dimension": st.one_of(st.integers(-2, 2000), JSON_VALUE),
        "truncate_prompt_tokens": st.one_of(st.integers(-3, 600), JSON_VALUE),
        "use_activation": st.one_of(st.booleans(), JSON_VALUE),
        "top_n": st.one_of(st.integers(-2, 5), JSON_VALUE),
        "embedding_types": st.lists(st.sampled_from(("float", "binary", "base64", "x")),
                                    max_size=3),
        "truncate": st.sampled_from(("NONE", "START", "END", "MIDDLE")),
        "max_tokens": st.one_of(st.integers(-2, 300), JSON_VALUE),
        "input_type": st.sampled_from(("query", "document", "other")),
        "request_id": REQUEST_ID, "priority": SMALL_INT, "normalize": st.booleans(),
        "instruction": st.one_of(SAFE_TEXT, JSON_VALUE),
        "chat_template_kwargs": st.one_of(st.fixed_dictionaries({}, optional={
            "instruction": SAFE_TEXT, "tools": JSON_VALUE, "tokenize": st.booleans()}),
            JSON_VALUE),
        "max_tokens_per_query": st.one_of(st.integers(-2, 300), JSON_VALUE),
        "max_tokens_per_doc": st.one_of(st.integers(-2, 300), JSON_VALUE),
    })))
    return body


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


ROUTES = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize", "/v1/messages",
          "/v1/responses", "/invocations", "/v1/chat/completions/batch",
          "/v1/chat/completions/render", "/v1/completions/render", "/inference/v1/generate",
          *POOLING_ROUTES)
RAW_BODIES = st.one_of(
    st.binary(max_size=40), BAD_UTF8.map(lambda b: b'{"prompt": "' + b + b'"}'),
    st.integers(1000, 100_000).map(lambda n: b"[" * n), st.just(b'{"prompt": NaN}'),
    st.sampled_from((b'{"prompt": "\\ud800"}', b'{"stop": ["\xed\xa0\x80"], "prompt": "a"}')),
    st.integers(0, 39).map(lambda k: b'{"prompt": "' + b"z" * (5_000_000 if not k else 10)
                           + b'"}'),
)


@st.composite
def http_case(draw) -> Case:
    pick = draw(st.integers(0, 19))
    if pick == 0:
        method, path = draw(st.sampled_from((("GET", "/v1/models"), ("GET", "/health"),
                                             ("PUT", "/v1/completions"),
                                             ("GET", "/v1/nothing-here"),
                                             ("POST", "/v1/embeddings"))))
        return Case("http", (method, path, None, {}), "read")
    route = draw(st.sampled_from(ROUTES))
    headers = {}
    if draw(st.integers(0, 4)) == 0:
        headers["X-Request-Id"] = draw(st.one_of(st.sampled_from(ID_POOL),
                                                 st.text("abc-_.~", min_size=1, max_size=300)))
    if pick == 1:
        return Case("http", ("POST", route, draw(RAW_BODIES), headers), "read")
    body = json.dumps(draw(http_body(route))).encode()  # NaN / Infinity literals included
    return Case("http", ("POST", route, body, headers), draw(st.sampled_from(
        ("read", "read", "read", "cancel"))))


# ---- one case -------------------------------------------------------------------------------
@st.composite
def case(draw) -> Case:
    pick = draw(st.integers(0, 99))
    if pick < 30:
        return Case("inference", draw(inference_request()), draw(ACTION))
    if pick < 45:
        return Case("vllm", draw(vllm_request()), draw(ACTION))
    if pick < 58:
        return draw(raw_case())
    if pick < 64:
        method = draw(UNARY)
        return Case("unary", (method, draw(st.one_of(st.binary(max_size=16), st.just(b"")))))
    if pick < 66:
        return Case("stream_other", (draw(STREAMING_OTHER), b""), draw(ACTION))
    if pick < 67:  # above grpc's 4 MiB receive limit
        return Case("raw", ("/doppelchip.v1.Inference/Generate",
                            field(4, b"a" * (4 * 2**20 + 10))), "read")
    if pick < 70:
        return Case("abort", [draw(REQUEST_ID) for _ in range(draw(st.integers(0, 3)))])
    return draw(http_case())
