"""The request limits a deployment sets (fleet file keys, or the same names as `serve` flags in
pod mode): prompt bytes, stop strings (count and length), grammar size and depth. A request
over one gets INVALID_ARGUMENT (both gRPC services) / 400 (HTTP) naming the limit, holds
nothing afterwards, and one at the limit is served."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
from fleets import fleet_doc
from ready import wait_ready
from server_proc import ServerProcess, released
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc

from clients.client import AsyncClient, build_request
from doppelchip.cli import build_parser
from doppelchip.cmd_serve import pod_fleet
from server.config import load_fleet

LIMITS = {"max_prompt_bytes": 400, "max_stop_strings": 3, "max_stop_bytes": 8,
          "max_grammar_bytes": 600, "max_grammar_depth": 6}
TIGHT = {"name": "tight", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
         "engine": "vllm", "max_model_len": 2048, **LIMITS}


def nested_schema(depth: int) -> dict:
    """An object schema `depth` objects deep (each level adds two bracket levels)."""
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


# (build_request keywords over the limit, at the limit, the limit's name)
CASES = [
    ({"prompt": "x" * (LIMITS["max_prompt_bytes"] + 1)},
     {"prompt": "x" * LIMITS["max_prompt_bytes"]}, "max_prompt_bytes"),
    ({"stop": ["a", "b", "c", "d"]}, {"stop": ["a", "b", "c"]}, "max_stop_strings"),
    ({"stop": ["123456789"]}, {"stop": ["12345678"]}, "max_stop_bytes"),
    ({"regex": "a" * (LIMITS["max_grammar_bytes"] + 1)}, {"regex": "a" * 600},
     "max_grammar_bytes"),
    ({"json_schema": json.dumps(nested_schema(4))}, {"json_schema": json.dumps(nested_schema(2))},
     "max_grammar_depth"),
]
IDS = [c[2] for c in CASES]


@pytest.fixture(scope="module")
def server():
    with ServerProcess(fleet_doc({"vllm_engine_deployment": "tight"}, [TIGHT])) as s:
        wait_ready(s.target)
        yield s


@pytest.fixture
async def client(server) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.target) as c:
        yield c


def _request(kwargs: dict):
    kwargs = dict(kwargs)
    return build_request(kwargs.pop("prompt", "hello"), deployment="tight", max_tokens=2,
                         **kwargs)


@pytest.mark.parametrize(("over", "at", "name"), CASES, ids=IDS)
async def test_inference_over_a_limit_is_invalid_argument(client, over, at, name):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        async for _ in client.stub.Generate(_request(over), timeout=30):
            pass
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"accepts at most {LIMITS[name]} ({name})" in e.value.details()
    await released(client, "tight")
    chunks = [c async for c in client.stub.Generate(_request(at), timeout=30)]
    assert chunks[-1].HasField("final")


def _vllm_request(kwargs: dict) -> vpb.GenerateRequest:
    sp = vpb.SamplingParams(max_tokens=2, stop=kwargs.get("stop", ()))
    for kind in ("regex", "json_schema"):
        if kind in kwargs:
            setattr(sp, kind, kwargs[kind])
    return vpb.GenerateRequest(text=kwargs.get("prompt", "hello"), sampling_params=sp,
                               stream=True)


@pytest.mark.parametrize(("over", "at", "name"), CASES, ids=IDS)
async def test_vllm_engine_over_a_limit_is_invalid_argument(server, client, over, at, name):
    async with grpc.aio.insecure_channel(server.target) as channel:
        stub = vpb_grpc.VllmEngineStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            async for _ in stub.Generate(_vllm_request(over), timeout=30):
                pass
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"({name})" in e.value.details()
        out = [r async for r in stub.Generate(_vllm_request(at), timeout=30)]
        assert out[-1].HasField("complete")
    await released(client, "tight")


def _completion(kwargs: dict) -> dict:
    body = {"model": "llama-3.1-8b", "prompt": kwargs.get("prompt", "hello"), "max_tokens": 2}
    if "stop" in kwargs:
        body["stop"] = kwargs["stop"]
    if "regex" in kwargs:
        body["structured_outputs"] = {"regex": kwargs["regex"]}
    if "json_schema" in kwargs:
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "deep", "schema": json.loads(kwargs["json_schema"])}}
    return body


@pytest.mark.parametrize(("over", "at", "name"), CASES, ids=IDS)
async def test_http_over_a_limit_is_400(server, client, over, at, name):
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        r = await http.post("/v1/completions", json=_completion(over))
        assert r.status_code == 400, r.text
        assert f"({name})" in r.json()["error"]["message"]
        ok = await http.post("/v1/completions", json=_completion(at))
        assert ok.status_code == 200, ok.text
    await released(client, "tight")


def test_pod_flags_set_the_limits():
    args = build_parser().parse_args(
        ["serve", "--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b",
         "--quant", "bf16", *(f"--{k.replace('_', '-')}={v}" for k, v in LIMITS.items())])
    (dep,) = pod_fleet(args, load_fleet(None)).deployments
    assert {k: getattr(dep, k) for k in LIMITS} == LIMITS
    bad = build_parser().parse_args(["serve", "--deployment", "vllm-h100",
                                     "--max-stop-strings", "0"])
    with pytest.raises(ValueError, match="--max-stop-strings must be >= 1"):
        pod_fleet(bad, load_fleet(None))


def test_serve_flags_set_the_listener_limits():
    from doppelchip.serve_security import security_overrides

    flags = {"--grpc-max-receive-message-length": ("grpc_max_receive_message_length", 1024),
             "--grpc-max-concurrent-streams": ("grpc_max_concurrent_streams", 8),
             "--h11-max-incomplete-event-size": ("h11_max_incomplete_event_size", 2048),
             "--h11-max-header-count": ("h11_max_header_count", 16),
             "--http-header-timeout": ("http_header_timeout_s", 2.5),
             "--http-timeout-keep-alive": ("http_timeout_keep_alive_s", 1.5)}
    args = build_parser().parse_args(
        ["serve", *(f"{flag}={value}" for flag, (_, value) in flags.items())])
    server = load_fleet(None).with_server(**security_overrides(args)).server
    assert {key: getattr(server, key) for key, _ in flags.values()} == dict(flags.values())
    defaults = load_fleet(None).server
    assert defaults.grpc_max_receive_message_length == 4 * 1024 * 1024  # grpc's, documented
