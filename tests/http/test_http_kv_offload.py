"""A vLLM pod with CPU KV offloading (`vllm serve ... --kv-offloading-size 1`), as llm-d's
tiered prefix cache runs it: a prompt the device cache evicted is served from host memory. Its
load is timed on the engine's own loop (a lone request waits for it and is then answered),
and vLLM's connector metrics say what the tier did: the external prefix-cache hits, the
tokens by source "host", the bytes and seconds loaded and stored, the tier's configuration.
Every request releases what it held in both tiers."""

from __future__ import annotations

import random

import httpx
import pytest
from fleets import assert_released
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess

from clients.client import AsyncClient

REPO = "meta-llama/Llama-3.1-8B-Instruct"
# 16-token blocks pinned (vLLM 0.34.0's default on this chip is 64): the device's 64 blocks
# hold 1,024 tokens, so the third 420-token prompt evicts the first, and the tier's
# arithmetic below (2 MiB blocks, whole blocks loaded) is in 16-token blocks
BLOCK = 16
ARGV = ("--kv-offloading-size", "1", "--num-gpu-blocks-override", "64", "--max-model-len", "1k",
        "--block-size", str(BLOCK), "--time-scale", "0.05")


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, REPO, *ARGV, vllm=True) as server:
        yield server


def metric(text: str, name: str, **labels: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def value(text: str, name: str, **labels: str) -> float:
    return sum(s.value for s in metric(text, name, **labels))


async def test_an_evicted_prompt_comes_back_from_host_memory(pod):
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 20000) for _ in range(420)] for _ in range(3)]
    before = pod.scrape()
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=60) as http:
        for p in [*prompts, prompts[0]]:  # the device holds 1,024 tokens: the first is evicted
            r = await http.post("/v1/completions", json={"model": REPO, "prompt": p,
                                                         "max_tokens": 4, "ignore_eos": True})
            assert r.status_code == 200, r.text
    after = pod.scrape()
    loaded = 419 - 419 % BLOCK  # its whole blocks, the last prompt token computed
    def gained(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    hits = gained("vllm:external_prefix_cache_hits_total")
    assert 0 < hits <= loaded and hits % BLOCK == 0  # (part may still be on the device)
    assert gained("vllm:prompt_tokens_cached_by_source_total", source="host") == hits
    assert gained("vllm:prompt_tokens_cached_by_source_total", source="p2p") == 0
    assert gained("vllm:external_prefix_cache_queries_total") >= 3 * 420
    assert gained("vllm:kv_offload_load_size_count") == 1
    per_token = 131072  # Llama 3.1 8B in BF16: 32 layers × 8 KV heads × 128 × 2 (K, V) × 2 B
    assert gained("vllm:kv_offload_load_bytes_total") == hits * per_token
    assert gained("vllm:kv_offload_total_bytes_total",
                  transfer_type="CPU_to_GPU") == hits * per_token  # (deprecated)
    assert gained("vllm:kv_offload_load_time_total") > 0
    assert gained("vllm:kv_offload_store_bytes_total") >= 3 * 416 * per_token
    async with AsyncClient(pod.target) as client:
        await assert_released(client, (await client.list_deployments()).deployments[0].name)


def test_the_tiers_configuration_is_vllms_info_series(pod):
    (info,) = metric(pod.scrape(), "vllm:kv_offload_config_info")
    block_bytes = BLOCK * 131072  # 2 MiB: a whole number of pages
    assert int(info.labels["cpu_num_chunks"]) == (1 << 30) // block_bytes
    assert info.labels["cpu_blocks_per_chunk"] == "1"
    assert int(info.labels["cpu_kv_cache_size_bytes"]) == 1 << 30
    # vLLM's CPUOffloadingInfo: requests of max_model_len (vLLM's "1k" is 1,000 tokens, 63
    # blocks) the tier holds, times that length
    assert int(info.labels["cpu_kv_cache_size_tokens"]) == (1 << 30) // block_bytes * 1000 // 63
    assert info.labels["engine"] == "0" and info.labels["model_name"] == REPO


async def test_reset_external_empties_the_tier_and_a_plain_reset_keeps_it(pod):
    rng = random.Random(1)
    prompt = [rng.randrange(1000, 20000) for _ in range(200)]
    body = {"model": REPO, "prompt": prompt, "max_tokens": 2, "ignore_eos": True}

    async def hits_of_a_resend(http: httpx.AsyncClient) -> float:
        before = value(pod.scrape(), "vllm:external_prefix_cache_hits_total")
        assert (await http.post("/v1/completions", json=body)).status_code == 200
        return value(pod.scrape(), "vllm:external_prefix_cache_hits_total") - before

    async with httpx.AsyncClient(base_url=pod.http_url, timeout=60) as http:
        assert (await http.post("/v1/completions", json=body)).status_code == 200
        r = await http.post("/reset_prefix_cache")  # the device's cache only
        assert r.json() == {"success": True}
        assert await hits_of_a_resend(http) == 192  # its 12 whole blocks, from the host
        r = await http.post("/reset_prefix_cache", params={"reset_external": "true"})
        assert r.json() == {"success": True}
        assert await hits_of_a_resend(http) == 0  # prefilled again


@pytest.mark.parametrize("reset_connector", [None, "false"])
async def test_a_sleep_empties_the_tier_unless_told_not_to(pod, reset_connector):
    """vLLM's sleep resets the KV connector with the device's cache (0.33.0 always, 0.34.0
    unless `reset_connector=false`): after a wake-up, a prompt the tier held is prefilled
    again, or, told not to, comes back from host memory."""
    rng = random.Random(2 if reset_connector is None else 3)
    prompt = [rng.randrange(1000, 20000) for _ in range(200)]
    body = {"model": REPO, "prompt": prompt, "max_tokens": 2, "ignore_eos": True}
    params = {"level": "1", **({"reset_connector": reset_connector} if reset_connector else {})}
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=60) as http:
        assert (await http.post("/v1/completions", json=body)).status_code == 200
        assert (await http.post("/sleep", params=params)).status_code == 200
        assert (await http.post("/wake_up")).json()["status"] == "awake"
        before = value(pod.scrape(), "vllm:external_prefix_cache_hits_total")
        assert (await http.post("/v1/completions", json=body)).status_code == 200
        hits = value(pod.scrape(), "vllm:external_prefix_cache_hits_total") - before
    assert hits == (0 if reset_connector is None else 192)  # 12 whole blocks from the host
    async with AsyncClient(pod.target) as client:
        await assert_released(client, (await client.list_deployments()).deployments[0].name)
