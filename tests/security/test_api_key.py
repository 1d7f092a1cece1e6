"""`--api-key`: every gRPC method but health and reflection, and every HTTP route but /health,
/ping, /version and /metrics, refuse a caller without one of the keys (UNAUTHENTICATED / 401
`{"error": "Unauthorized"}`, vLLM's body) and serve one with it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
from conftest import TEST_FLEET
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from server_proc import ServerProcess
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc
from smg_grpc_proto.generated import common_pb2
from starlette.testclient import TestClient

from clients.client import AsyncClient
from doppelchip.cmd_serve import with_env_api_key
from doppelchip.v1 import inference_pb2 as pb
from server.auth import ApiKeys
from server.config import parse_fleet
from server.engine.tokenizer import get_tokenizer
from server.http.app import build_app

KEYS = ("key-one", "key-two")
TOK = get_tokenizer()
SERVICES = [pb.DESCRIPTOR.services_by_name["Inference"],
            vpb.DESCRIPTOR.services_by_name["VllmEngine"]]
METHODS = [(s.full_name, m) for s in SERVICES for m in s.methods]


@pytest.fixture(scope="module")
def server():
    with ServerProcess(TEST_FLEET, "--api-key", *KEYS) as s:
        yield s


@pytest.fixture
async def channel(server) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(server.target) as ch:
        yield ch


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


async def raw_call(channel: grpc.aio.Channel, service: str, method, metadata=None) -> None:
    """Call any method with an empty request (bytes in, bytes out)."""
    path = f"/{service}/{method.name}"
    if method.server_streaming:
        async for _ in channel.unary_stream(path)(b"", metadata=metadata, timeout=10):
            pass
    else:
        await channel.unary_unary(path)(b"", metadata=metadata, timeout=10)


@pytest.mark.parametrize(("service", "method"), METHODS, ids=[m.name for _, m in METHODS])
@pytest.mark.parametrize("metadata", [None, bearer("wrong"), (("authorization", "key-one"),),
                                      (("authorization", "Basic key-one"),)],
                         ids=["none", "wrong-key", "no-scheme", "basic"])
async def test_every_grpc_method_refuses_without_a_key(channel, service, method, metadata):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await raw_call(channel, service, method, metadata)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "API key" in e.value.details()


@pytest.mark.parametrize(("service", "method"), METHODS, ids=[m.name for _, m in METHODS])
async def test_every_grpc_method_passes_the_guard_with_a_key(channel, service, method):
    """With a key the call reaches its handler: whatever it answers to an empty request, it is
    not UNAUTHENTICATED."""
    try:
        await raw_call(channel, service, method, bearer(KEYS[1]))
    except grpc.aio.AioRpcError as e:
        assert e.code() != grpc.StatusCode.UNAUTHENTICATED, e.details()


async def test_inference_rpcs_succeed_with_either_key(server):
    for key in KEYS:
        async with AsyncClient(server.target, api_key=key) as client:
            names = {d.name for d in (await client.list_deployments()).deployments}
            assert names == {"fast", "slow"}
            assert (await client.get_deployment("fast")).name == "fast"
            chunks = [c async for c in client.generate("hello", max_tokens=4, ignore_eos=True)]
            assert chunks[-1].HasField("final")
            assert sum(len(c.token_ids) for c in chunks) == 4
    async with AsyncClient(server.target, api_key="nope") as client:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await client.list_deployments()
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_vllm_engine_rpcs_succeed_with_a_key(channel):
    stub, md = vpb_grpc.VllmEngineStub(channel), bearer(KEYS[0])
    assert (await stub.HealthCheck(vpb.HealthCheckRequest(), metadata=md)).healthy
    info = await stub.GetModelInfo(vpb.GetModelInfoRequest(), metadata=md)
    assert info.vocab_size == TOK.vocab_size
    assert (await stub.GetServerInfo(vpb.GetServerInfoRequest(), metadata=md)).server_type
    assert (await stub.GetLoads(vpb.GetLoadsRequest(), metadata=md)).dp_rank_count == 1
    await stub.Abort(vpb.AbortRequest(request_ids=["nothing"]), metadata=md)
    tokenizer = [c async for c in stub.GetTokenizer(common_pb2.GetTokenizerRequest(),
                                                    metadata=md)]
    assert tokenizer and tokenizer[-1].sha256
    req = vpb.GenerateRequest(tokenized=vpb.TokenizedInput(input_ids=TOK.encode("hi")),
                              sampling_params=vpb.SamplingParams(max_tokens=3), stream=True)
    out = [r async for r in stub.Generate(req, metadata=md)]
    assert out[-1].HasField("complete")


async def test_health_and_reflection_stay_open(channel):
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = [a async for a in stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]))]
    names = {s.name for s in answers[0].list_services_response.service}
    assert {"doppelchip.v1.Inference", "vllm.grpc.engine.VllmEngine"} <= names


GUARDED = [("GET", "/v1/models", None),
           ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}),
           ("POST", "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
           ("POST", "/tokenize", {"prompt": "hi"}),
           ("POST", "/detokenize", {"tokens": [1, 2]})]
OPEN = ["/health", "/ping", "/version", "/metrics"]


@pytest.fixture
async def http(server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as c:
        yield c


@pytest.mark.parametrize(("method", "path", "body"), GUARDED, ids=[g[1] for g in GUARDED])
async def test_guarded_http_routes(http, method, path, body):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEYS[0]},
                    {"Authorization": f"Basic {KEYS[0]}"}):
        r = await http.request(method, path, json=body, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.json() == {"error": "Unauthorized"}
    for key in KEYS:
        r = await http.request(method, path, json=body,
                               headers={"Authorization": f"bearer {key}"})  # any case, as vLLM
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", OPEN)
async def test_open_http_routes(http, path):
    assert (await http.get(path)).status_code == 200


async def test_unknown_paths_and_preflight_are_not_guarded(http):
    assert (await http.get("/no/such/route")).status_code == 404
    assert (await http.options("/v1/completions")).status_code == 405  # not 401, as vLLM


async def test_the_openai_client_is_refused_and_served(server):
    import openai

    async with openai.AsyncOpenAI(base_url=f"{server.http_url}/v1", api_key="wrong",
                                  max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            await bad.models.list()
    async with openai.AsyncOpenAI(base_url=f"{server.http_url}/v1", api_key=KEYS[1],
                                  max_retries=0) as good:
        assert [m.id async for m in good.models.list()]


def test_a_route_added_later_is_guarded():
    """The guard is derived from the route table (as vLLM's after 0.33.0): a route registered
    after the app was built, e.g. /sleep, needs the key; public ones do not."""
    app = build_app(None, ApiKeys(["k"]))  # type: ignore[arg-type]

    @app.post("/sleep")
    async def sleep() -> dict:
        return {"slept": True}

    @app.get("/health/extra")
    async def extra() -> dict:
        return {}

    with TestClient(app) as c:
        assert c.post("/sleep").status_code == 401
        assert c.post("/sleep", headers={"Authorization": "Bearer k"}).json() == {"slept": True}
        assert c.get("/health/extra").status_code == 200


def test_api_key_check():
    keys = ApiKeys(["a", "bcd"])
    assert keys.verify("Bearer a") and keys.verify("BEARER bcd") and keys.verify(b"bearer a")
    for bad in (None, "", "a", "Bearer", "Bearer ", "Bearer b", "Bearer  a", "Token a",
                "Bearer a "):
        assert not keys.verify(bad), bad
    assert not ApiKeys() and ApiKeys().verify(None)  # no keys: authentication is off
    assert not ApiKeys([""])  # an empty key is no key, as vLLM filters them


def test_vllm_api_key_env_is_the_fallback():
    base = parse_fleet(TEST_FLEET)
    assert with_env_api_key(base, {"VLLM_API_KEY": "e"}).server.api_key == ("e",)
    assert with_env_api_key(base, {}).server.api_key == ()
    given = base.with_server(api_key=("flag",))
    assert with_env_api_key(given, {"VLLM_API_KEY": "e"}).server.api_key == ("flag",)
