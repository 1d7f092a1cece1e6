"""promtool lints the scrape of a pod with vLLM's CPU KV offloading: its connector families
(counters, histograms with and without `transfer_type`, gauges, the config info) after loads
and stores, and nothing but vLLM's own naming is flagged."""

from __future__ import annotations

import random

import httpx
from obs_prometheus import binary
from server_proc import ServerProcess
from test_obs_promtool import ALLOWED, promtool

REPO = "meta-llama/Llama-3.1-8B-Instruct"


def test_promtool_passes_the_offloading_families_after_loads():
    binary("promtool")  # (fails with how to fetch it when missing)
    argv = ("--kv-offloading-size", "1", "--num-gpu-blocks-override", "64", "--time-scale",
            "0.05")
    rng = random.Random(2)
    prompts = [[rng.randrange(1000, 20000) for _ in range(420)] for _ in range(3)]
    with ServerProcess(None, REPO, *argv, vllm=True) as pod, \
            httpx.Client(base_url=pod.http_url, timeout=60) as http:
        for p in [*prompts, prompts[0]]:  # the last one is loaded from the host tier
            r = http.post("/v1/completions", json={"model": REPO, "prompt": p,
                                                   "max_tokens": 2, "ignore_eos": True})
            assert r.status_code == 200, r.text
        text = pod.scrape()
    assert "vllm:kv_offload_load_size_bucket" in text and 'transfer_type="CPU_to_GPU"' in text
    result = promtool("check", "metrics", stdin=text)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert [p for p in problems if not any(a in p for a in ALLOWED)] == []
    assert any("vllm:kv_offload" in p for p in problems)  # promtool did read those families
