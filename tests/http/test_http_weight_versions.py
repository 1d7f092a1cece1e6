"""vLLM 0.33.0's weight version label on a real data-parallel pod (VLLM_SERVER_DEV_MODE=1): an
RL trainer labels the pod's weights with `/update_weight_version`, `/weight_info` reads the
label, and a request with `return_weight_versions` learns which label sampled which of its
output tokens — two spans when the label changed under a `/pause?mode=keep` mid-request, as
in-flight weight updates do. `/inference/v1/generate` always reports them; `/get_world_size`
counts the pod's chips as vLLM's parallel config does."""

from __future__ import annotations

import json

import httpx
import pytest
from http_helpers import http_client, stream_events
from server_proc import ServerProcess

MODEL = "llama-3.1-8b"
POD = ["--chip", "h100-sxm", "--engine", "vllm", "--model", MODEL, "--quant", "fp8",
       "--max-model-len", "1024", "--tp", "2", "--data-parallel-size", "2",
       "--time-scale", "0.2", "--enable-scale-out"]
PROMPT = [(13 * i) % 3000 + 100 for i in range(40)]


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *POD, env={"VLLM_SERVER_DEV_MODE": "1"}) as s:
        yield s


def body(**extra) -> dict:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "ignore_eos": True, **extra}


async def label(http: httpx.AsyncClient, version: str) -> None:
    r = await http.post("/update_weight_version", json={"new_version": version})
    assert r.json() == {"success": True, "new_version": version}
    assert (await http.get("/weight_info")).json() == {"weight_version": version}


async def test_a_label_changed_under_a_keep_pause_splits_the_output(pod):
    async with http_client(pod) as http:
        await label(http, "v1")
        seen, last = 0, None
        # 900 tokens: ~0.7 s of wall time at this pod's time scale, for the three calls below
        # to land mid-request even on a loaded 2-core machine (300 did not, once)
        async with http.stream("POST", "/v1/completions", json=body(
                max_tokens=900, stream=True, return_weight_versions=True)) as r:
            lines = r.aiter_lines()
            async for line in lines:  # some tokens under v1, then the trainer steps in
                if line.startswith("data: ") and line != "data: [DONE]":
                    seen += len(json.loads(line[6:])["choices"][0]["text"]) > 0
                    if seen >= 5:
                        break
            assert (await http.post("/pause?mode=keep")).status_code == 200
            await label(http, "v2")
            assert (await http.post("/resume")).status_code == 200
            async for line in lines:
                if line.startswith("data: ") and line != "data: [DONE]":
                    last = json.loads(line[6:])
    spans = last["choices"][0]["weight_versions"]
    assert [s["version"] for s in spans] == ["v1", "v2"]
    assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"]
    assert spans[1]["end"] == 900 and seen <= spans[0]["end"] < 900


async def test_every_choice_reports_its_label_only_when_asked(pod):
    async with http_client(pod) as http:
        await label(http, "policy-7")
        plain = (await http.post("/v1/completions", json=body())).json()
        asked = (await http.post("/v1/completions", json=body(
            n=2, return_weight_versions=True))).json()
        chat = (await http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            "ignore_eos": True, "return_weight_versions": True})).json()
        _, events = await stream_events(http, "/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            "ignore_eos": True, "stream": True, "return_weight_versions": True})
    assert plain["choices"][0]["weight_versions"] is None
    for choice in asked["choices"]:
        assert choice["weight_versions"] == [{"version": "policy-7", "start": 0, "end": 12}]
    assert chat["choices"][0]["weight_versions"] == [
        {"version": "policy-7", "start": 0, "end": 3}]
    chunks = [e for e in events if isinstance(e, dict) and e["choices"]]
    assert all(c["choices"][0].get("weight_versions") is None for c in chunks[:-1])
    assert chunks[-1]["choices"][0]["weight_versions"] == [
        {"version": "policy-7", "start": 0, "end": 3}]


async def test_generate_always_reports_the_label(pod):
    async with http_client(pod) as http:
        await label(http, "g1")
        r = await http.post("/inference/v1/generate", json={
            "token_ids": PROMPT, "sampling_params": {"max_tokens": 4, "ignore_eos": True}})
    assert r.json()["choices"][0]["weight_versions"] == [{"version": "g1", "start": 0,
                                                          "end": 4}]


async def test_world_size_is_the_parallel_configs(pod):
    async with http_client(pod) as http:
        assert (await http.get("/get_world_size")).json() == {"world_size": 4}  # tp2 × dp2
        r = await http.get("/get_world_size?include_dp=false")
        assert r.json() == {"world_size": 2}
        r = await http.post("/update_weight_version", json={})
        assert r.status_code == 400  # new_version is required (FastAPI's validation)
