"""vLLM 0.33.0's per-request KV-event fields through a vLLM pod's HTTP routes, as clients send
them: `session_id` in the body (the official client's `extra_body`), the `X-Session-ID`
header, `vllm_xargs` (`session_id`, `kv_cache_report_mode: "full"`), on completions, chat,
Responses and `/inference/v1/generate` (`sampling_params.extra_args`, the header). The events
are read from the pod's replay socket: stores name the session that stored them, a "full"
report names the reused prefix from the root, and `/v1/chat/completions/render` shows the
extra arguments as vLLM's render does. Bad `vllm_xargs` are a 400; every request is
released."""

from __future__ import annotations

import json

import httpx
import msgspec
import pytest
from http_helpers import openai_client, pod_released
from kv_replay import replayed
from server_proc import ServerProcess

EVENTS = json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://*:0",
                     "replay_endpoint": "tcp://*:0"})
POD = ("--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b", "--quant", "bf16",
       "--max-model-len", "512", "--block-size", "16", "--time-scale", "0.05",
       "--enable-scale-out", "--kv-events-config", EVENTS)
MODEL = "llama-3.1-8b"


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *POD) as s:
        line = s.wait_for_log(r"KV events: publishing on \S+ \(bound\), replay on \S+")
        s.replay_at = line.rsplit(" ", 1)[1]
        yield s


def stores(pod, start: int = 0) -> list[dict]:
    """The BlockStored events the publisher holds from batch `start` on (its replay)."""
    return [e for _, payload in replayed(pod.replay_at, start, frames=4)
            for e in msgspec.msgpack.decode(payload)[1] if e["type"] == "BlockStored"]


def sessions(events: list[dict]) -> set:
    return {e.get("session_id") for e in events}


async def test_sessions_and_full_reports_reach_the_kv_events(pod):
    prompt = list(range(1000, 1100))  # 6 full blocks and 4 tokens
    async with openai_client(pod) as client:
        await client.completions.create(model=MODEL, prompt=prompt, max_tokens=1,
                                        extra_body={"session_id": "body-1"})
        first = stores(pod)
        assert sessions(first) == {"body-1"}
        assert sum(len(e["block_hashes"]) for e in first) >= 6
        assert all(e["extra_keys"] == [None] * len(e["block_hashes"]) for e in first)
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "tell me a story " * 8}],
            max_tokens=1, extra_headers={"X-Session-ID": "header-2"})
        assert sessions(stores(pod)[len(first):]) == {"header-2"}
        before = len(stores(pod))
        await client.completions.create(  # the same prompt: a hit, reported in full
            model=MODEL, prompt=prompt, max_tokens=1,
            extra_body={"vllm_xargs": {"session_id": "xargs-3", "kv_cache_report_mode": "full"}})
        (report,) = [e for e in stores(pod)[before:] if e["parent_block_hash"] is None]
        assert report["session_id"] == "xargs-3" and report["token_ids"] == prompt[:96]
        assert report["block_hashes"] == [h for e in first for h in e["block_hashes"]][:6]
        before = len(stores(pod))
        await client.completions.create(  # the body's session wins over the header
            model=MODEL, prompt=prompt, max_tokens=1, extra_headers={"X-Session-ID": "no"},
            extra_body={"session_id": "body-4", "vllm_xargs": {"kv_cache_report_mode": "full"}})
        assert sessions(stores(pod)[before:]) == {"body-4"}
        before = len(stores(pod))
        await client.responses.create(model=MODEL, input="a new topic entirely " * 8,
                                      max_output_tokens=1, extra_body={"session_id": "resp-5"})
        assert sessions(stores(pod)[before:]) == {"resp-5"}
    await pod_released(pod)


async def test_generate_takes_the_header_and_extra_args(pod):
    prompt = list(range(3000, 3040))
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=30) as http:
        async def generate(mode: str) -> list[dict]:
            before = len(stores(pod))
            r = await http.post("/inference/v1/generate", headers={"X-Session-ID": "gen-6"},
                                json={"model": MODEL, "token_ids": prompt, "sampling_params": {
                                    "max_tokens": 1, "extra_args": {"kv_cache_report_mode": mode}}})
            assert r.status_code == 200, r.text
            return stores(pod)[before:]

        (stored,) = await generate("incremental")  # 2 full blocks, stored
        assert stored["session_id"] == "gen-6" and len(stored["block_hashes"]) == 2
        assert await generate("incremental") == []  # a hit, not reported
        (report,) = await generate("full")  # the same hit, reported from the root
        assert (report["block_hashes"], report["parent_block_hash"], report["session_id"]) == (
            stored["block_hashes"], None, "gen-6")
        r = await http.post("/v1/chat/completions/render", json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "vllm_xargs": {"kv_cache_report_mode": "full"}})
        assert r.status_code == 200, r.text
        assert r.json()["sampling_params"]["extra_args"] == {"kv_cache_report_mode": "full"}
        for bad in ({"a": {"nested": 1}}, ["not", "a", "map"], {"a": [[1]]}):
            r = await http.post("/v1/completions", json={
                "model": MODEL, "prompt": "hi", "max_tokens": 1, "vllm_xargs": bad})
            assert r.status_code == 400, (bad, r.text)
            assert "vllm_xargs" in r.text
    await pod_released(pod)
