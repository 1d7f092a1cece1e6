"""TensorRT-LLM pods behind the real smg gateway in gRPC mode, as smg fronts `trtllm-serve
--grpc` workers: smg detects them as trtllm gRPC workers (its detection tries sglang, then
vllm, then trtllm), reads their model info into its labels, tokenizes with the bundle they
ship (told the model with `--model-path`, as TensorRT-LLM's model info names no path), routes
chat and completions to them (a repeated prompt to the pod that caches it, with
`cache_aware`), streams `n` > 1, and passes a pod's refusal on as a 400."""

from __future__ import annotations

import pytest
from fleets import assert_released
from gateway_harness import SMG, check_cache_aware_chat, gateway_over
from server_proc import ServerProcess

from clients.client import AsyncClient

pytestmark = pytest.mark.skipif(SMG is None, reason="smg is not installed (make install-dev)")

CTX = 1024
POD = ("--chip", "h100-sxm", "--engine", "tensorrt-llm", "--model", "llama-3.1-8b", "--quant",
       "bf16", "--max-model-len", str(CTX), "--time-scale", "0.05", "--grpc-api", "trtllm")


async def released(pods) -> None:
    for pod in pods:
        async with AsyncClient(pod.target) as c:
            await assert_released(c, (await c.list_deployments()).deployments[0].name)


async def test_smg_fronts_trtllm_pods_over_grpc(tmp_path):
    pods = [ServerProcess(None, *POD) for _ in range(2)]
    # TensorRT-LLM's model info names no path: smg is told the model (`--model-path`, as for
    # a real trtllm-serve) and loads the tokenizer bundle the pods ship (GetTokenizer)
    async with gateway_over(tmp_path, pods, lambda pod: f"grpc://{pod.target}", "llama-3.1-8b",
                            "--policy", "cache_aware", "--model-path", "llama-3.1-8b") as gw:
        status, workers = await gw.call("GET", "/workers")
        assert status == 200
        assert sorted((w["runtime_type"], w["connection_mode"]) for w in workers["workers"]) \
            == [("trtllm", "grpc")] * 2
        assert all(w["labels"]["max_seq_len"] == str(CTX) for w in workers["workers"])
        await check_cache_aware_chat(gw)
        status, out = await gw.call("POST", "/v1/completions", {
            "model": "llama-3.1-8b", "prompt": "The capital of France is", "max_tokens": 5,
            "ignore_eos": True})
        assert status == 200 and out["usage"]["completion_tokens"] == 5, out
        prompt = " ".join(["fox"] * (CTX - 1))  # CTX tokens: within smg's check, not the pod's
        status, out = await gw.call("POST", "/v1/completions", {  # the worker's refusal
            "model": "llama-3.1-8b", "prompt": prompt, "max_tokens": 3})
        assert status == 400 and "exceeds maximum input length" in str(out), out
        await released(gw.replicas)
