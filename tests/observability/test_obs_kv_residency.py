"""vLLM's observability flags on a real server: `--kv-cache-metrics` exports the KV residency
histograms of the blocks its sampler follows, and `--custom-histogram-buckets` replaces a
bucket family's bounds in every vllm: histogram of it (vLLM 0.33.0's names, help and labels:
vllm_reference.json). A small KV pool makes blocks leave the prefix cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ROOT, ServerProcess

REFERENCE = json.loads((Path(__file__).parent / "vllm_reference.json").read_text())
RESIDENCY = ("vllm:kv_block_lifetime_seconds", "vllm:kv_block_idle_before_evict_seconds",
             "vllm:kv_block_reuse_gap_seconds")
KV_BOUNDS = [0.5, 5.0, 50.0]
TTFT_BOUNDS = [0.25, 2.5]
DOC = {"server": {"time_scale": 0.05,
                  "custom_histogram_buckets": {"kv_cache_residency": KV_BOUNDS,
                                               "time_to_first_token": TTFT_BOUNDS}},
       # 16-token blocks (vLLM 0.34.0's default is 64): the pool and the block counts below
       # are in blocks of 16 tokens
       "deployments": [{"name": "small", "model": "llama-3.1-8b", "quant": "fp8",
                        "chip": "h100-sxm", "engine": "vllm", "max_model_len": 512,
                        "block_size": 16, "kv_blocks": 48, "kv_cache_metrics": True,
                        "kv_cache_metrics_sample": 1.0}]}
HOT = [(13 * i) % 2000 + 100 for i in range(160)]  # ten full blocks, hit twice


@pytest.fixture(scope="module")
def families():
    with ServerProcess(DOC) as server, httpx.Client(
            base_url=f"http://127.0.0.1:{server.http_port}", timeout=60) as http:
        def complete(prompt: list[int]) -> None:
            r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2,
                                                   "ignore_eos": True})
            assert r.status_code == 200, r.text

        for _ in range(3):  # computed, then hit twice
            complete(HOT)
        for i in range(8):  # 8 × 20 blocks through a 48-block pool: the cache turns over
            complete([(7 * j + i) % 2500 + 300 for j in range(320)])
        text = server.scrape()
    return {m.name: m for m in text_string_to_metric_families(text)}


def samples(fam, suffix: str) -> list:
    return [s for s in fam.samples if s.name.endswith(suffix)]


def test_the_residency_histograms_are_vllms(families):
    for name in RESIDENCY:
        fam, spec = families[name], REFERENCE["series"][name]
        assert fam.type == "histogram" and fam.documentation == spec["help"], name
        labels = {k for s in fam.samples for k in s.labels} - {"le"}
        assert labels == {*spec["labels"], "deployment"}, name
        bounds = [float(s.labels["le"]) for s in samples(fam, "_bucket")]
        assert bounds == [*KV_BOUNDS, float("inf")], name  # the custom family's bounds


def test_evicted_blocks_report_lifetime_idle_time_and_reuse_gaps(families):
    count = {n: samples(families[n], "_count")[0].value for n in RESIDENCY}
    total = {n: samples(families[n], "_sum")[0].value for n in RESIDENCY}
    lifetime, idle, reuse = RESIDENCY
    assert count[lifetime] > 0 and count[idle] == count[lifetime]  # one of each per eviction
    assert total[lifetime] >= total[idle] > 0  # a block is idle for part of its life
    assert count[reuse] >= 1 and total[reuse] > 0  # HOT's blocks were hit, then evicted


def test_custom_buckets_replace_one_family_only(families):
    ttft = [float(s.labels["le"]) for s in samples(
        families["vllm:time_to_first_token_seconds"], "_bucket")]
    assert ttft == [*TTFT_BOUNDS, float("inf")]
    e2e = [float(s.labels["le"]) for s in samples(
        families["vllm:e2e_request_latency_seconds"], "_bucket")]
    assert e2e == [*REFERENCE["bucket_families"]["request_latency"], float("inf")]


def serve_error(*flags: str) -> str:
    """`doppelchip serve` with bad flags: exit status 2 and its message (nothing starts)."""
    r = subprocess.run([sys.executable, "-m", "doppelchip.cli", "serve", "--port", "0",
                        "--http-port", "0", *flags], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    return r.stderr


@pytest.mark.parametrize(("value", "message"), [
    ('{"nope": [1]}', "unknown bucket family 'nope'; known families: ['inter_token_latency'"),
    ('{"request_latency": []}', "custom_histogram_buckets['request_latency']: bucket list "
     "must not be empty"),
    ('{"request_latency": [1, 1]}', "bounds [1, 1] must be strictly increasing"),
    ('{"request_latency": [0]}', "bound 0 must be finite and greater than 0"),
    ('{"request_latency": [true]}', "bound True must be a number, not a boolean"),
    ("[1]", "must be a JSON object"),
    ("{", "not valid JSON"),
])
def test_bad_custom_buckets_stop_the_server_with_vllms_message(value, message):
    assert message in serve_error("--custom-histogram-buckets", value)


def test_a_bad_sample_rate_stops_the_server():
    err = serve_error("--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b",
                      "--quant", "fp8", "--kv-cache-metrics", "--kv-cache-metrics-sample", "0")
    assert "--kv-cache-metrics-sample must be in (0, 1], got 0.0" in err
