"""MLX pods behind the real smg gateway (1.13.0) in gRPC mode, as smg fronts its own MLX
servicer's workers: smg detects them as mlx gRPC workers (its detection tries sglang, vllm,
trtllm, tokenspeed, then mlx), reads their model info (MLX's names the model path, so smg needs
no `--model-path`), tokenizes with the bundle they ship, serves a completion and a stream
through them, and passes a pod's refusal on as a 400."""

from __future__ import annotations

import pytest
from fleets import assert_released
from gateway_harness import SMG, gateway_over
from server_proc import ServerProcess

from clients.client import AsyncClient

pytestmark = pytest.mark.skipif(SMG is None, reason="smg is not installed (make install-dev)")

CTX = 1024
MODEL = "llama-3.1-8b"  # mlx-m4max's model, its served name
POD = ("--deployment", "mlx-m4max", "--max-model-len", str(CTX), "--time-scale", "0.05",
       "--grpc-api", "mlx")


async def released(pods) -> None:
    for pod in pods:
        async with AsyncClient(pod.target) as c:
            await assert_released(c, (await c.list_deployments()).deployments[0].name)


async def test_smg_fronts_mlx_pods_over_grpc(tmp_path):
    pods = [ServerProcess(None, *POD) for _ in range(2)]
    async with gateway_over(tmp_path, pods, lambda pod: f"grpc://{pod.target}", MODEL) as gw:
        status, workers = await gw.call("GET", "/workers")
        assert status == 200
        assert sorted((w["runtime_type"], w["connection_mode"]) for w in workers["workers"]) \
            == [("mlx", "grpc")] * 2, workers
        for w in workers["workers"]:  # GetModelInfo's fields, as smg's labels
            labels = w["labels"]
            assert (labels["served_model_name"], labels["max_context_length"],
                    labels["max_req_input_len"], labels["model_type"]) == \
                (MODEL, str(CTX), str(CTX), "llama"), labels
            assert w["models"][0]["context_length"] == CTX
        status, out = await gw.call("POST", "/v1/completions", {
            "model": MODEL, "prompt": "The capital of France is", "max_tokens": 5,
            "ignore_eos": True})
        assert status == 200 and out["usage"]["completion_tokens"] == 5, out
        assert out["choices"][0]["finish_reason"] == "length"
        status, events = await gw.stream("/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 6, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}})
        assert status == 200
        assert events[-1]["usage"]["completion_tokens"] == 6
        assert "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
        prompt = " ".join(["fox"] * (CTX - 1))  # CTX tokens: within smg's check, not the pod's
        status, out = await gw.call("POST", "/v1/completions", {  # the worker's refusal
            "model": MODEL, "prompt": prompt, "max_tokens": 3})
        assert status == 400 and "leaves no room" in str(out), out
        await released(gw.replicas)
