"""P/D pods with a host tier, as llm-d runs P/D with CPU offloading: vLLM's MultiConnector of
the NIXL connector and the OffloadingConnector on both pods. The NIXL part still moves a
prompt's KV from the prefill pod to the decode pod (the decode pod computes only its last
token), and the decode pod's host tier keeps the blocks that arrived: when the device has
evicted them, a later request with that prompt loads them from host memory instead."""

from __future__ import annotations

import json
import os
import random

import httpx
import pytest
from server_proc import ServerProcess, free_run, metric

from server.engine.kv_transfer import KvTransferConfig

MODEL = "llama-3.1-8b"
# 16-token blocks (vLLM 0.34.0's default is 64): 64 of them (1,024 tokens) hold two of the
# 420-token prompts below, so a third evicts the first; and 416 of its tokens are whole blocks
BLOCK = 16
POD = ["--chip", "h100-sxm", "--engine", "vllm", "--model", MODEL, "--quant", "bf16",
       "--time-scale", "0.05", "--num-gpu-blocks-override", "64", "--block-size", str(BLOCK)]
MULTI = json.dumps({"kv_connector": "MultiConnector", "kv_role": "kv_both",
                    "kv_connector_extra_config": {"connectors": [
                        {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                        {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                         "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30}}]}})
rng = random.Random(4)
PROMPTS = [[rng.randrange(1000, 20000) for _ in range(420)] for _ in range(3)]


def test_a_multi_connector_is_its_parts():
    cfg = KvTransferConfig.parse(MULTI, env={})
    assert cfg.nixl is not None and cfg.offloading is not None
    assert cfg.nixl.engine_id == cfg.offloading.engine_id == cfg.engine_id  # vLLM's
    assert cfg.offloading.extra == {"cpu_bytes_to_use": 1 << 30}
    nested = json.dumps({"kv_connector": "MultiConnector", "kv_role": "kv_both",
                         "kv_connector_extra_config": {"connectors": [json.loads(MULTI)]}})
    for bad, says in ((nested, "'MultiConnector' is not emulated"),
                      (MULTI.replace("NixlConnector", "OffloadingConnector"), "one of each"),
                      (MULTI.replace('"connectors"', '"connector"'), "needs `connectors`"),
                      (MULTI.replace('"kv_role": "kv_both"}', '"kv_role": "kv_both", '
                                     '"nope": 1}', 1), "unknown key")):
        with pytest.raises(ValueError, match=says):
            KvTransferConfig.parse(bad, env={})


def test_every_admission_queries_a_configured_connector_as_vllm_counts_it():
    """vLLM's `connector_prefix_cache_queries`: with any KV connector, each admitted request
    queries it for its tokens past the device hit (hits: what the connector supplied)."""
    from server.engine.build import build_core
    from server.engine.options import EngineOptions
    from server.engine.request import Request, SamplingParams

    def queries(**options) -> tuple[int, int]:
        core = build_core(EngineOptions(name="a", model=MODEL, quant="bf16", chip="h100-sxm",
                                        engine="vllm", block_size=BLOCK, **options))
        for rid in ("first", "again"):  # the second hits the device cache: 416 tokens
            core.add_request(Request(rid, PROMPTS[0], SamplingParams(max_tokens=2)))
            while core.has_unfinished():
                core.step()
        st = core.scheduler.stats
        return st.external_prefix_cache_queries, st.external_prefix_cache_hits

    nixl = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
    assert queries(kv_transfer_config=nixl) == (420 + 420 - 416, 0)
    assert queries(kv_transfer_config=MULTI) == (420 + 420 - 416, 0)
    assert queries() == (0, 0)  # no connector: nothing to query


@pytest.fixture(scope="module")
def pods():
    base = free_run(2)
    started = []
    for role, port in (("prefill", base), ("decode", base + 1)):
        os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(port)
        try:
            started.append(ServerProcess(None, "--deployment", role, *POD,
                                         "--kv-transfer-config", MULTI).start())
        finally:
            os.environ.pop("VLLM_NIXL_SIDE_CHANNEL_PORT", None)
    yield started
    for s in started:
        s.stop()


def test_pd_moves_the_kv_and_the_decode_pods_tier_keeps_it(pods):
    prefill, decode = pods
    body = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 4, "ignore_eos": True}
    with httpx.Client(timeout=60) as http:
        p = http.post(f"{prefill.http_url}/v1/completions", json={
            **body, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}).json()
        params = p["kv_transfer_params"]
        assert params["do_remote_prefill"] is True
        d = http.post(f"{decode.http_url}/v1/completions",
                      json={**body, "kv_transfer_params": params})
        assert d.status_code == 200
        text = decode.scrape()
        assert metric(text, "vllm:prompt_tokens_by_source_total",
                      source="external_kv_transfer") == 419  # all but the last token
        assert metric(text, "vllm:prompt_tokens_by_source_total", source="local_compute") == 1
        for other in PROMPTS[1:]:  # the decode pod's device evicts the transferred blocks
            r = http.post(f"{decode.http_url}/v1/completions", json={**body, "prompt": other})
            assert r.status_code == 200
        before = cached(decode.scrape())
        again = http.post(f"{decode.http_url}/v1/completions", json=body)  # no P/D this time
        assert again.status_code == 200
    after = cached(decode.scrape())
    host, device = (after[k] - before[k] for k in ("host", "device"))
    assert host > 0 and host + device == 416  # the arrived prompt's whole blocks: what the
    #                                          device evicted comes from the host tier


def cached(text: str) -> dict[str, float]:
    return {source: metric(text, "vllm:prompt_tokens_cached_by_source_total", source=source)
            for source in ("host", "device")}
