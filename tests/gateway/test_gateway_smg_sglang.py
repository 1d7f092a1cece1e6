"""SGLang pods behind the real smg gateway, as smg fronts SGLang servers. In HTTP mode smg
detects the backend as sglang (`/v1/models`' owned_by, `/server_info`), polls each pod's
`/v1/loads`, routes SGLang's native `/generate` and the OpenAI routes to them, sends a
repeated prompt to the pod that caches it (`cache_aware`), and fans `/flush_cache` out. In
gRPC mode (the pods' `sglang.grpc.scheduler` service, as `--smg-grpc-mode` serves it) smg
detects them as sglang gRPC workers, tokenizes with the bundle they ship, and streams."""

from __future__ import annotations

import asyncio

import pytest
from fleets import assert_released
from gateway_harness import SMG, check_cache_aware_chat, gateway_over, http
from server_proc import ServerProcess

from clients.client import AsyncClient

pytestmark = pytest.mark.skipif(SMG is None, reason="smg is not installed (make install-dev)")

POD = ("--chip", "h100-sxm", "--engine", "sglang", "--model", "llama-3.1-8b", "--quant",
       "bf16", "--max-model-len", "1024", "--time-scale", "0.05", "--http-api", "sglang")


def sglang_gateway(tmp_path, pod_args, *smg_args: str):
    """Two SGLang pods behind smg (HTTP workers), everything stopped on the way out."""
    return gateway_over(tmp_path, [ServerProcess(None, *pod_args) for _ in range(2)],
                        lambda pod: pod.http_url, pod_args[pod_args.index("--model") + 1],
                        "--load-monitor-interval", "1", *smg_args)


@pytest.fixture
async def gw(tmp_path):
    async with sglang_gateway(tmp_path, POD, "--policy", "cache_aware") as g:
        yield g


async def released(pods) -> None:
    for pod in pods:
        async with AsyncClient(pod.target) as c:
            await assert_released(c, (await c.list_deployments()).deployments[0].name)


async def test_smg_fronts_sglang_pods(gw):
    status, workers = await gw.call("GET", "/workers")
    assert status == 200
    assert sorted(w["runtime_type"] for w in workers["workers"]) == ["sglang", "sglang"]
    prompt = "A long shared system prompt. " * 40
    cached = []
    for _ in range(4):
        status, out = await gw.call("POST", "/generate", {
            "text": prompt, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}})
        assert status == 200, out
        assert len(out["output_ids"]) == 4 and out["meta_info"]["finish_reason"]["type"] == \
            "length"
        cached.append(out["meta_info"]["cached_tokens"])
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])  # the pod that holds it
    by_worker: dict = {}
    for _ in range(100):  # smg's load monitor polls each pod's /v1/loads on its own clock
        status, loads = await gw.call("GET", "/get_loads")
        assert status == 200
        by_worker = {load["worker"]: load for load in loads["loads"]}
        if set(by_worker) == set(gw.urls):
            break
        await asyncio.sleep(0.05)
    assert set(by_worker) == set(gw.urls)  # smg read every pod's /v1/loads
    assert all(load["max_total_num_tokens"] > 0 for load in by_worker.values())
    status, out = await gw.call("POST", "/v1/completions", {
        "model": "llama-3.1-8b", "prompt": "hi", "max_tokens": 3})
    assert status == 200 and out["usage"]["completion_tokens"] <= 3
    status, _ = await gw.call("POST", "/flush_cache")
    assert status == 200
    status, out = await gw.call("POST", "/generate", {
        "text": prompt, "sampling_params": {"max_new_tokens": 1}})
    assert status == 200 and out["meta_info"]["cached_tokens"] == 0
    await released(gw.replicas)


async def test_smg_reranks_on_sglang_pods(tmp_path):
    """smg's HTTP router reads a worker's rerank answer as SGLang's list: through SGLang pods
    of a cross-encoder its `/v1/rerank` works (through vLLM pods it cannot: EMBEDDINGS.md)."""
    reranker = ("--chip", "h100-sxm", "--engine", "sglang", "--model", "bge-reranker-v2-m3",
                "--quant", "f16", "--time-scale", "0.05", "--http-api", "sglang")
    docs = ["hi", "The giant panda is a bear native to China.", "pandas is a library"]
    async with sglang_gateway(tmp_path, reranker, "--policy", "round_robin") as g:
        status, out = await g.call("POST", "/v1/rerank", {
            "model": "bge-reranker-v2-m3", "query": "what is a panda?", "documents": docs})
        assert status == 200, out
        _, direct = await asyncio.to_thread(http, "POST", g.urls[0] + "/v1/rerank", {
            "query": "what is a panda?", "documents": docs})
        assert [r["index"] for r in out["results"]] == [r["index"] for r in direct]
        assert [r["score"] for r in out["results"]] == pytest.approx(  # (smg writes f32)
            [r["score"] for r in direct], rel=1e-6)
        await released(g.replicas)


async def test_smg_fronts_sglang_pods_over_grpc(tmp_path):
    pods = [ServerProcess(None, *POD) for _ in range(2)]
    async with gateway_over(tmp_path, pods, lambda pod: f"grpc://{pod.target}", "llama-3.1-8b",
                            "--policy", "cache_aware") as gw:
        status, workers = await gw.call("GET", "/workers")
        assert status == 200
        assert sorted((w["runtime_type"], w["connection_mode"]) for w in workers["workers"]) \
            == [("sglang", "grpc")] * 2
        assert all(w["labels"]["max_req_input_len"] == "1018" for w in workers["workers"])
        await check_cache_aware_chat(gw)
        prompt = " ".join(["fox"] * 1019)  # 1020 tokens: under smg's 1024, over the pod's 1018
        status, out = await gw.call("POST", "/v1/completions", {  # the worker's refusal
            "model": "llama-3.1-8b", "prompt": prompt, "max_tokens": 3})
        assert status == 400 and "exceeds the maximum allowed length (1018 tokens)" in \
            str(out), out
        await released(gw.replicas)
