"""`--api-key` in fleet mode behind two front-end processes: every method of every registered
gRPC service but health and reflection, and every HTTP route but /health, /ping, /version and
/metrics, refuse a caller without one of the keys (UNAUTHENTICATED / 401 `{"error":
"Unauthorized"}`, vLLM's body) and serve one with it.

The lists are derived, not written out: the gRPC services from the server's reflection, the
HTTP routes from the app's route table. Each has a table of successful calls here, and a test
fails when a service, method or route has no entry — so a new one is covered the day it lands.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from unittest import mock

import grpc
import httpx
import pytest
from fleets import fleet_doc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from ready import wait_ready
from server_proc import ServerProcess
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc
from smg_grpc_proto.generated import common_pb2

from doppelchip.v1 import inference_pb2 as pb
from doppelchip.v1 import inference_pb2_grpc as pb_grpc
from server.auth import OPEN_GRPC_SERVICES
from server.engine.tokenizer import get_tokenizer
from server.http.app import PUBLIC_PATHS, build_app

EMBED = {"name": "embed", "model": "qwen3-embedding-0.6b", "quant": "bf16", "chip": "h100-sxm",
         "engine": "vllm", "max_model_len": 256}
RERANK = {"name": "rerank", "model": "qwen3-reranker-0.6b", "quant": "bf16", "chip": "h100-sxm",
          "engine": "vllm", "max_model_len": 256, "hf_overrides": '{"architectures": '
          '["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"], '
          '"method": "from_2_way_softmax"}'}
KEYS = ("key-one", "key-two")
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}  # vLLM's development routes (/pause, ...) too
TOK = get_tokenizer()
FRONT_ENDS = 2
SERVICES = {s.full_name: s for s in (pb.DESCRIPTOR.services_by_name["Inference"],
                                     vpb.DESCRIPTOR.services_by_name["VllmEngine"])}
METHODS = [(s.full_name, m) for s in SERVICES.values() for m in s.methods]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    doc = fleet_doc({"api_server_count": FRONT_ENDS})
    # vLLM's profiling routes, with the config as a fleet-file table
    doc["server"]["profiler_config"] = {"profiler": "torch", "torch_profiler_dir": str(
        tmp_path_factory.mktemp("traces"))}
    for d in doc["deployments"]:  # LoRA's routes answer 200 on a deployment serving adapters
        if d["name"] == "slow":  # (and vLLM 0.34.0's /checkpoint/* with sleep mode)
            d.update(enable_lora=True, max_loras=2, enable_sleep_mode=True)
    doc["deployments"].append(EMBED)  # an embedding model: the pooling routes are mounted
    doc["deployments"].append(RERANK)  # and a classifier: /classify
    with ServerProcess(doc, "--api-key", *KEYS, "--enable-scale-out",
                       "--enable-tokenizer-info-endpoint", env=DEV_MODE) as s:
        wait_ready(s.target, api_key=KEYS[0])
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


# ---- gRPC --------------------------------------------------------------------------------
async def test_the_registered_services_are_the_guarded_ones_and_the_open_ones(channel):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = [a async for a in stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]))]
    names = {s.name for s in answers[0].list_services_response.service}
    assert names - set(OPEN_GRPC_SERVICES) == set(SERVICES)


@pytest.mark.parametrize(("service", "method"), METHODS, ids=[m.name for _, m in METHODS])
@pytest.mark.parametrize("metadata", [None, bearer("wrong"), (("authorization", "key-one"),),
                                      (("authorization", "Basic key-one"),)],
                         ids=["none", "wrong-key", "no-scheme", "basic"])
async def test_every_grpc_method_refuses_without_a_key(channel, service, method, metadata):
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await raw_call(channel, service, method, metadata)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "API key" in e.value.details()


async def _inference(channel, md) -> dict[str, object]:
    s = pb_grpc.InferenceStub(channel)
    listing = await s.ListDeployments(pb.ListDeploymentsRequest(), metadata=md, timeout=10)
    one = await s.GetDeployment(pb.GetDeploymentRequest(name="fast"), metadata=md, timeout=10)
    req = pb.GenerateRequest(text="hello", deployment="fast",
                             sampling=pb.SamplingParams(max_tokens=4, ignore_eos=True))
    chunks = [c async for c in s.Generate(req, metadata=md, timeout=10)]
    names = {"fast", "slow", "embed", "rerank"}
    return {"ListDeployments": {d.name for d in listing.deployments} == names,
            "GetDeployment": one.name == "fast",
            "Generate": chunks[-1].final.usage.completion_tokens == 4}


async def _vllm_engine(channel, md) -> dict[str, object]:
    s = vpb_grpc.VllmEngineStub(channel)
    tokenizer = [c async for c in s.GetTokenizer(common_pb2.GetTokenizerRequest(), metadata=md)]
    req = vpb.GenerateRequest(tokenized=vpb.TokenizedInput(input_ids=TOK.encode("hi")),
                              sampling_params=vpb.SamplingParams(max_tokens=3), stream=True)
    out = [r async for r in s.Generate(req, metadata=md)]
    await s.Abort(vpb.AbortRequest(request_ids=["nothing"]), metadata=md)
    served = {
        "HealthCheck": (await s.HealthCheck(vpb.HealthCheckRequest(), metadata=md)).healthy,
        "GetModelInfo": (await s.GetModelInfo(vpb.GetModelInfoRequest(),
                                              metadata=md)).vocab_size == TOK.vocab_size,
        "GetServerInfo": bool((await s.GetServerInfo(vpb.GetServerInfoRequest(),
                                                     metadata=md)).server_type),
        "GetLoads": (await s.GetLoads(vpb.GetLoadsRequest(), metadata=md)).dp_rank_count == 1,
        "Abort": True,  # answered OK (raised otherwise)
        "GetTokenizer": bool(tokenizer and tokenizer[-1].sha256),
        "FlushCache": (await s.FlushCache(common_pb2.FlushCacheRequest(),
                                          metadata=md)).message != "",
        "Generate": out[-1].HasField("complete"),
    }
    # Embed reaches the servicer with the key, which refuses it: "fast" generates
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await s.Embed(vpb.EmbedRequest(tokenized=vpb.TokenizedInput(input_ids=[1, 2])),
                      metadata=md)
    served["Embed"] = (e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                       and "This model does not support pooling" in (e.value.details() or ""))
    # methods the servicer does not implement: with the key they reach it and it says so
    for name in sorted(UNIMPLEMENTED):
        method = SERVICES["vllm.grpc.engine.VllmEngine"].methods_by_name[name]
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await raw_call(channel, "vllm.grpc.engine.VllmEngine", method, md)
        served[name] = e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    return served


# (SubscribeKvEvents: UNIMPLEMENTED while the deployment publishes no KV events, as smg's)
UNIMPLEMENTED = {"StartProfile", "StopProfile", "SubscribeKvEvents"}


CALLS = {"doppelchip.v1.Inference": _inference, "vllm.grpc.engine.VllmEngine": _vllm_engine}


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("service", sorted(SERVICES))
async def test_every_grpc_method_succeeds_with_a_key(channel, service, key):
    results = await CALLS[service](channel, bearer(key))
    assert set(results) == {m.name for m in SERVICES[service].methods}  # every method called
    assert all(results.values()), results


async def test_health_and_reflection_stay_open(channel):
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_every_front_end_checks_the_key(server):
    """Connections spread over the front ends (SO_REUSEPORT): each one seen refuses a call
    without the key and serves one with it; both are seen (a fresh connection each time,
    bounded)."""
    seen: set[str] = set()
    own = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own per channel
    request = pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(max_tokens=1))
    for _ in range(64):
        async with grpc.aio.insecure_channel(server.target, options=own) as channel:
            stub = pb_grpc.InferenceStub(channel)
            call = stub.Generate(request, timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                async for _ in call:
                    pass
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            call = stub.Generate(request, metadata=bearer(KEYS[0]), timeout=10)
            seen.add(dict(await call.initial_metadata())["x-doppelchip-frontend"])
            assert [c async for c in call][-1].HasField("final")
        if len(seen) == FRONT_ENDS:
            break
    assert seen == {str(i) for i in range(FRONT_ENDS)}


# ---- HTTP --------------------------------------------------------------------------------
BODIES = {("GET", "/v1/models"): None,
          # FastAPI's docs, served as vLLM serves them (guarded here like every non-probe)
          ("GET", "/openapi.json"): None, ("GET", "/docs"): None,
          ("GET", "/docs/oauth2-redirect"): None, ("GET", "/redoc"): None,
          ("POST", "/v1/completions"): {"prompt": "hi", "max_tokens": 2},
          ("POST", "/v1/chat/completions"): {"messages": [{"role": "user", "content": "hi"}],
                                             "max_tokens": 2},
          ("POST", "/v1/chat/completions/batch"): {
              "messages": [[{"role": "user", "content": "hi"}]], "max_tokens": 2},
          ("POST", "/v1/messages"): {"model": "llama-3.1-8b", "max_tokens": 2,
                                     "messages": [{"role": "user", "content": "hi"}]},
          ("POST", "/v1/messages/count_tokens"): {
              "model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]},
          ("POST", "/v1/responses"): {"model": "llama-3.1-8b", "input": "hi",
                                      "max_output_tokens": 2},
          ("GET", "/v1/responses/{response_id}"): None,
          ("POST", "/v1/responses/{response_id}/cancel"): None,
          ("POST", "/invocations"): {"prompt": "hi", "max_tokens": 2},
          ("POST", "/tokenize"): {"prompt": "hi"},
          ("POST", "/detokenize"): {"tokens": [1, 2]},
          ("GET", "/is_sleeping"): None,
          ("POST", "/sleep"): None,  # (then woken up: AFTER)
          ("POST", "/wake_up"): None,
          ("POST", "/release_kv_cache_memory"): None,  # (refused: nothing is paused)
          ("GET", "/checkpoint/status"): None,  # (503: running)
          ("POST", "/checkpoint/prepare"): None,  # (then restored: AFTER)
          ("POST", "/checkpoint/restore"): None,
          ("GET", "/tokenizer_info"): None,
          ("POST", "/update_weight_version"): {"new_version": "v1"},
          ("GET", "/weight_info"): None,
          ("GET", "/get_world_size"): None,
          ("POST", "/start_profile"): None,  # (then stopped: AFTER)
          ("POST", "/stop_profile"): None,
          ("GET", "/kv_event_sources"): None,
          ("POST", "/reset_prefix_cache"): None,
          ("POST", "/pause"): None,  # (then resumed: AFTER)
          ("POST", "/resume"): None,
          ("GET", "/is_paused"): None,
          ("POST", "/abort_requests"): {"request_ids": ["nobody"]},
          # vLLM's scale-out routes (the server runs with --enable-scale-out)
          ("POST", "/v1/chat/completions/render"): {"messages": [{"role": "user",
                                                                  "content": "hi"}]},
          ("POST", "/v1/messages/render"): {"model": "llama-3.1-8b", "max_tokens": 2,
                                            "messages": [{"role": "user", "content": "hi"}]},
          ("POST", "/v1/completions/render"): {"prompt": "hi"},
          ("POST", "/v1/responses/render"): {"model": "llama-3.1-8b", "input": "hi"},
          ("POST", "/v1/chat/completions/derender"): None,
          ("POST", "/v1/completions/derender"): None,
          ("POST", "/inference/v1/generate"): {"token_ids": [1, 2],
                                               "sampling_params": {"max_tokens": 2}},
          ("POST", "/inference/v1/abort_requests"): {"request_ids": ["nobody"]},
          # an embedding model's routes (docs/EMBEDDINGS.md)
          **{("POST", p): {"model": EMBED["model"], "input": "hi"}
             for p in ("/v1/embeddings", "/pooling")},
          ("POST", "/v2/embed"): {"model": EMBED["model"], "texts": ["hi"]},
          ("POST", "/classify"): {"model": RERANK["model"], "input": "hi"},
          **{("POST", p): {"model": EMBED["model"], "queries": "a", "documents": ["b"]}
             for p in ("/score", "/v1/score")},
          **{("POST", p): {"model": EMBED["model"], "query": "a", "documents": ["b"]}
             for p in ("/rerank", "/v1/rerank", "/v2/rerank")},
          ("POST", "/v1/load_lora_adapter"):
              lambda key: {"lora_name": f"load-{key}", "lora_path": "/a", "deployment": "slow"},
          ("POST", "/v1/unload_lora_adapter"):
              lambda key: {"lora_name": f"unload-{key}", "deployment": "slow"}}
# calls made with the key around a route's own (the state it needs, and undoing what it did)
BEFORE = {("POST", "/v1/unload_lora_adapter"): lambda key: (
    "POST", "/v1/load_lora_adapter",
    {"lora_name": f"unload-{key}", "lora_path": "/a", "deployment": "slow"})}
AFTER = {("POST", "/sleep"): lambda key: ("POST", "/wake_up", None),
         ("POST", "/start_profile"): lambda key: ("POST", "/stop_profile", None),
         ("POST", "/pause"): lambda key: ("POST", "/resume", None),
         ("POST", "/checkpoint/prepare"): lambda key: ("POST", "/checkpoint/restore", None)}
# what a route answers past the key when not 200: no response is ever stored (vLLM's default)
ANSWERS = {("GET", "/v1/responses/{response_id}"): (404, "not found"),
           ("POST", "/release_kv_cache_memory"): (500, "requires a completed pause first"),
           ("GET", "/checkpoint/status"): (503, '"running"'),
           ("POST", "/v1/responses/{response_id}/cancel"): (404, "not found"),
           **{("POST", p): (501, "not served by doppelchip") for p in (
               "/v1/chat/completions/derender", "/v1/completions/derender")}}


def route_table() -> list[tuple[str, str]]:
    """(method, path) of every route the server's app registers (HEAD aside: GET's twin)."""
    with mock.patch.dict(os.environ, DEV_MODE):  # as the server is started
        app = build_app(None)  # type: ignore[arg-type]  # routes only; nothing is served
    return sorted((m, r.path) for r in app.router.routes
                  for m in getattr(r, "methods", None) or () if m != "HEAD")


ROUTES = route_table()
GUARDED = [r for r in ROUTES if r[1] not in PUBLIC_PATHS]
OPEN = [r for r in ROUTES if r[1] in PUBLIC_PATHS]


def test_every_guarded_route_has_a_call_here():
    assert set(GUARDED) == set(BODIES)
    assert {p for _, p in OPEN} == set(PUBLIC_PATHS)


@pytest.fixture
async def http(server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as c:
        yield c


@pytest.mark.parametrize(("method", "path"), GUARDED, ids=[f"{m} {p}" for m, p in GUARDED])
async def test_guarded_http_routes(http, method, path):
    body = BODIES[(method, path)]
    body_of = body if callable(body) else lambda key: body
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEYS[0]},
                    {"Authorization": f"Basic {KEYS[0]}"}):
        r = await http.request(method, path, json=body_of(KEYS[0]), headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.json() == {"error": "Unauthorized"}
    for key in KEYS:
        auth = {"Authorization": f"bearer {key}"}  # any case, as vLLM
        if (before := BEFORE.get((method, path))) is not None:
            m, p, b = before(key)
            assert (await http.request(m, p, json=b, headers=auth)).status_code == 200
        r = await http.request(method, path, json=body_of(key), headers=auth)
        status, words = ANSWERS.get((method, path), (200, ""))
        assert r.status_code == status and words in r.text, r.text
        if (after := AFTER.get((method, path))) is not None:
            m, p, b = after(key)
            assert (await http.request(m, p, json=b, headers=auth)).status_code == 200


@pytest.mark.parametrize(("method", "path"), OPEN, ids=[f"{m} {p}" for m, p in OPEN])
async def test_open_http_routes(http, method, path):
    assert (await http.request(method, path)).status_code == 200


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
