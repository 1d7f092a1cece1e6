"""TensorRT-LLM pods behind the real smg gateway in gRPC mode, as smg fronts `trtllm-serve
--grpc` workers: smg detects them as trtllm gRPC workers (its detection tries sglang, then
vllm, then trtllm), reads their model info into its labels, tokenizes with the bundle they
ship (told the model with `--model-path`, as TensorRT-LLM's model info names no path), routes
chat and completions to them (a repeated prompt to the pod that caches it, with
`cache_aware`), streams `n` > 1, and passes a pod's refusal on as a 400."""

from __future__ import annotations

import pytest
from fleets import assert_released
from gateway_harness import SMG, gateway_over
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
        prompt = "A long shared system prompt. " * 40
        body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 6, "ignore_eos": True, "seed": 3}
        cached = []
        for _ in range(3):
            status, out = await gw.call("POST", "/v1/chat/completions", body)
            assert status == 200, out
            assert out["usage"]["completion_tokens"] == 6
            assert out["choices"][0]["finish_reason"] == "length"
            cached.append((out["usage"].get("prompt_tokens_details") or {}).get(
                "cached_tokens", 0))
        assert cached[0] == 0 and all(c > 0 for c in cached[1:])  # the pod that holds it
        status, events = await gw.stream("/v1/chat/completions", {
            **body, "stream": True, "n": 2, "stream_options": {"include_usage": True}})
        assert status == 200
        texts = {i: "".join(c["delta"].get("content") or "" for e in events
                            for c in e["choices"] if c["index"] == i) for i in (0, 1)}
        assert texts[0] == out["choices"][0]["message"]["content"] and texts[1]
        assert events[-1]["usage"]["completion_tokens"] == 12  # n = 2 outputs of 6
        status, out = await gw.call("POST", "/v1/completions", {
            "model": "llama-3.1-8b", "prompt": "The capital of France is", "max_tokens": 5,
            "ignore_eos": True})
        assert status == 200 and out["usage"]["completion_tokens"] == 5, out
        prompt = " ".join(["fox"] * (CTX - 1))  # CTX tokens: within smg's check, not the pod's
        status, out = await gw.call("POST", "/v1/completions", {  # the worker's refusal
            "model": "llama-3.1-8b", "prompt": prompt, "max_tokens": 3})
        assert status == 400 and "exceeds maximum input length" in str(out), out
        await released(gw.replicas)
