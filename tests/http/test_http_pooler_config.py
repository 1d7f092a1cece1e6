"""vLLM's `--pooler-config` on served pooling models: two deployments of the same model side by
side, one configured. MEAN pooling on a decoder turns off its prefix caching and chunked
prefill (vLLM's `is_prefix_caching_supported`); `use_activation` and `dimensions` are the
defaults of a request that leaves them unset (`PoolingParams._merge_default_parameters`); a
classifier's `logit_mean` / `logit_sigma` calibrate its logits before the activation."""

from __future__ import annotations

import math

import httpx
import numpy as np
import pytest
from fleets import fleet_doc
from http_helpers import sample_sum
from server_proc import ServerProcess

MRL = '{"is_matryoshka": true}'
BASE = {"model": "qwen3-embedding-0.6b", "quant": "bf16", "chip": "rtx-4090", "engine": "vllm",
        "max_model_len": 512, "hf_overrides": MRL}
PLAIN = {**BASE, "name": "plain", "served_model_name": ["plain"]}
TUNED = {**BASE, "name": "tuned", "served_model_name": ["tuned"], "pooler_config":
         '{"pooling_type": "MEAN", "use_activation": false, "dimensions": 256}'}
RR = {"model": "bge-reranker-v2-m3", "quant": "f16", "chip": "rtx-4090", "engine": "vllm",
      "max_model_len": 512}
RR_PLAIN = {**RR, "name": "rr", "served_model_name": ["rr"]}
RR_CAL = {**RR, "name": "rr-cal", "served_model_name": ["rr-cal"],
          "pooler_config": '{"logit_mean": 1.5, "logit_sigma": 2.0}'}


@pytest.fixture(scope="module")
def pod():
    doc = fleet_doc(server={"time_scale": 0.05}, deployments=[PLAIN, TUNED, RR_PLAIN, RR_CAL])
    with ServerProcess(doc) as server:
        yield server


async def embed(http: httpx.AsyncClient, model: str, **extra) -> list[float]:
    r = await http.post("/v1/embeddings", json={"model": model, "input": "a cat sat", **extra})
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["embedding"]


async def test_request_defaults_come_from_the_pooler_config(pod):
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=60) as http:
        plain, tuned = await embed(http, "plain"), await embed(http, "tuned")
        assert len(plain) == 1024 and np.linalg.norm(plain) == pytest.approx(1, abs=1e-5)
        assert len(tuned) == 256  # dimensions 256 unless the request says otherwise
        assert np.linalg.norm(tuned) != pytest.approx(1, abs=1e-3)  # not normalised
        asked = await embed(http, "tuned", dimensions=512, use_activation=True)
        assert len(asked) == 512 and np.linalg.norm(asked) == pytest.approx(1, abs=1e-5)


async def test_mean_pooling_on_a_decoder_turns_off_prefix_caching(pod):
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=60) as http:
        text = "the same long prompt, again and again " * 20
        before = pod.scrape()
        for model in ("plain", "tuned", "plain", "tuned"):
            r = await http.post("/v1/embeddings", json={"model": model, "input": text})
            assert r.status_code == 200, r.text
        after = pod.scrape()

    def gained(name: str, deployment: str) -> float:
        def total(text: str) -> float:
            from prometheus_client.parser import text_string_to_metric_families

            return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                       if s.name == name and s.labels.get("deployment") == deployment)
        return total(after) - total(before)

    assert gained("vllm:prefix_cache_hits_total", "plain") > 0
    assert gained("vllm:prefix_cache_queries_total", "tuned") == 0
    assert gained("vllm:prompt_tokens_cached_total", "tuned") == 0
    info = [line for line in after.splitlines() if line.startswith("vllm:cache_config_info")]
    assert any('deployment="tuned"' in x and 'enable_prefix_caching="False"' in x for x in info)
    assert sample_sum(after, "vllm:prompt_tokens_total") > 0


async def test_a_classifier_is_calibrated_before_its_activation(pod):
    body = {"query": "where did the cat sit?", "documents": ["The cat sat on the mat.", "Rain."]}
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=60) as http:
        async def scores(model: str, **extra) -> list[float]:
            r = await http.post("/score", json={"model": model, "text_1": body["query"],
                                                "text_2": body["documents"], **extra})
            assert r.status_code == 200, r.text
            return [d["score"] for d in r.json()["data"]]

        raw = await scores("rr", use_activation=False)
        calibrated = await scores("rr-cal", use_activation=False)
        assert calibrated == pytest.approx([(x - 1.5) / 2.0 for x in raw], rel=1e-6)
        probs = await scores("rr-cal")
        assert probs == pytest.approx([1 / (1 + math.exp(-c)) for c in calibrated], rel=1e-6)
        assert probs != pytest.approx(await scores("rr"), rel=1e-3)


def test_a_bad_pooler_config_stops_the_pod_with_vllms_words(capsys):
    from doppelchip.cli import main

    rc = main(["vllm", "serve", "BAAI/bge-m3", "--pooler-config",
               '{"pooling_type": "MEAN", "seq_pooling_type": "CLS"}'])
    assert rc == 2
    assert "Cannot set both `pooling_type` and `seq_pooling_type`" in capsys.readouterr().err
