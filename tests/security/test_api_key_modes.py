"""`--api-key` beyond the fleet: a pod (`serve --deployment`) keyed by `VLLM_API_KEY` as vLLM
is, a key holder's `VllmEngine.Abort` from another connection ending the request, a route
added after start-up being guarded, and the key check itself."""

from __future__ import annotations

import json

import grpc
import httpx
import pytest
from fleets import TEST_FLEET, fleet_doc
from ready import wait_ready
from server_proc import ServerProcess
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc
from starlette.testclient import TestClient

from clients.client import AsyncClient
from doppelchip.serve_security import with_env_api_key
from server.auth import ApiKeys
from server.config import parse_fleet
from server.engine.tokenizer import get_tokenizer
from server.http.app import build_app

KEY = "pod-key"
TOK = get_tokenizer()


@pytest.fixture(scope="module")
def pod():
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_API_KEY", KEY)  # the child inherits it; no --api-key flag
    try:
        with ServerProcess(TEST_FLEET, "--deployment", "fast") as s:
            wait_ready(s.target, api_key=KEY)
            yield s
    finally:
        mp.undo()


async def test_a_pod_takes_its_key_from_vllm_api_key(pod):
    async with AsyncClient(pod.target) as bare:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await bare.list_deployments()
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    async with AsyncClient(pod.target, api_key=KEY) as keyed:
        assert [d.name for d in (await keyed.list_deployments()).deployments] == ["fast"]
        chunks = [c async for c in keyed.generate("hi", max_tokens=2, ignore_eos=True)]
        assert chunks[-1].final.usage.completion_tokens == 2
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=30) as http:
        assert (await http.get("/v1/models")).status_code == 401
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200
        r = await http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200 and r.json()["data"]


@pytest.fixture(scope="module")
def realtime():
    """One deployment with a long context: a stream of 8,000 tokens lasts seconds (0.3 ms of
    wall time a token), long enough to abort."""
    fast = next(d for d in TEST_FLEET["deployments"] if d["name"] == "fast")
    long = {**fast, "name": "long", "max_model_len": 8192}
    with ServerProcess(fleet_doc(None, [long]), "--api-key", KEY) as s:
        wait_ready(s.target, api_key=KEY)
        yield s


async def test_a_key_holder_aborts_from_another_connection(realtime):
    """Without keys an Abort from another connection does nothing (tests/service/
    test_request_ids.py); a caller holding the key may abort any request."""
    own = [("grpc.use_local_subchannel_pool", 1)]
    md = (("authorization", f"Bearer {KEY}"),)
    req = vpb.GenerateRequest(request_id="victim-1", stream=True,
                              tokenized=vpb.TokenizedInput(input_ids=TOK.encode("hi")),
                              sampling_params=vpb.SamplingParams(max_tokens=8000,
                                                                 ignore_eos=True))
    async with grpc.aio.insecure_channel(realtime.target, options=own) as a, \
            grpc.aio.insecure_channel(realtime.target, options=own) as b:
        call = vpb_grpc.VllmEngineStub(a).Generate(req, metadata=md, timeout=60)
        await call.initial_metadata()  # the request is in the engine
        first = await call.read()  # and streaming
        assert first.HasField("chunk")
        await vpb_grpc.VllmEngineStub(b).Abort(vpb.AbortRequest(request_ids=["victim-1"]),
                                               metadata=md, timeout=10)
        rest = []
        while (r := await call.read()) is not grpc.aio.EOF:
            rest.append(r)
    assert rest[-1].HasField("complete") and rest[-1].complete.finish_reason == "abort"
    generated = sum(len(r.chunk.token_ids) for r in [first, *rest] if r.HasField("chunk"))
    assert generated < 8000


def test_a_route_added_later_is_guarded():
    """The guard is derived from the route table: a route registered after the app was built
    (as /sleep and /v1/load_lora_adapter once were) needs the key; public ones do not."""
    app = build_app(None, ApiKeys(["k"]))  # type: ignore[arg-type]

    @app.post("/added_later")
    async def later() -> dict:
        return {"slept": True}

    @app.post("/v1/added_later")
    async def load() -> dict:
        return {"loaded": True}

    @app.get("/health/extra")
    async def extra() -> dict:
        return {}

    with TestClient(app) as c:
        for path, answer in (("/added_later", {"slept": True}),
                             ("/v1/added_later", {"loaded": True})):
            assert c.post(path).status_code == 401
            assert c.post(path, headers={"Authorization": "Bearer k"}).json() == answer
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


def test_the_cli_clients_send_the_key(realtime, capsys, monkeypatch):
    """`doppelchip generate` and `doppelchip load` send `--api-key` (or $VLLM_API_KEY)."""
    from doppelchip.cli import main

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    target = ["--target", realtime.target]
    assert main(["generate", "hi", "--max-tokens", "2", "--ignore-eos", *target,
                 "--api-key", KEY]) == 0
    assert "2 tokens" in capsys.readouterr().err
    assert main(["generate", "hi", "--max-tokens", "2", *target]) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    assert main(["load", *target, "--num-requests", "2", "--isl", "8", "--osl", "2",
                 "--ignore-eos", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["requests"] == 2 and not summary["errors"]
