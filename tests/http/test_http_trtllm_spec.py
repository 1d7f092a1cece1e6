"""A speculating TensorRT-LLM pod (trtllm-serve's `speculative_config`: an Eagle3 chain of 3
drafts): the `specDecodingStats` of its `/metrics` iteration stats and the `trtllm_spec_decode_*`
series of `/prometheus/metrics`, as TensorRT-LLM defines them, agree with each other and with
the engine's verification steps; its speculative config info names the draft."""

from __future__ import annotations

import asyncio
import json

import pytest
from http_helpers import http_client, pod_released
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess

K = 3  # max_draft_len
DRAFT = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
SPEC = {"method": "eagle3", "num_speculative_tokens": K, "acceptance_rate": 0.6, "model": DRAFT}
POD = ("--chip", "h100-sxm", "--engine", "tensorrt-llm", "--model", "llama-3.1-8b", "--quant",
       "fp8", "--max-model-len", "2048", "--block-size", "32", "--time-scale", "0.05",
       "--served-model-name", "trt-eagle", "--http-api", "trtllm", "--enable-metrics",
       "--speculative-config", json.dumps(SPEC))  # what `trtllm-serve --config` translates to


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *POD) as s:
        yield s


def samples(text: str) -> dict[str, list]:
    return {f.name: [s for s in f.samples if not s.name.endswith("_created")]
            for f in text_string_to_metric_families(text)}


async def run_round(h, n: int) -> tuple[dict, dict[str, list]]:
    """`n` requests at once, then the `/metrics` entry and the series their finish refreshed."""

    async def one(i: int) -> None:
        r = await h.post("/v1/completions", json={
            "model": "m", "prompt": f"Story {i}:", "max_tokens": 48, "ignore_eos": True})
        assert r.status_code == 200, r.text

    await asyncio.gather(*(one(i) for i in range(n)))
    stats = (await h.get("/metrics")).json()
    assert stats, "a request finished: one iteration entry"
    return stats[-1], samples((await h.get("/prometheus/metrics")).text)


def total(m: dict[str, list], name: str) -> float:
    (sample,) = m[name]
    assert set(sample.labels) == {"engine_type", "model_name"}
    return sample.value


async def test_iteration_stats_and_series_agree_with_the_verification_steps(pod):
    async with http_client(pod) as h:
        await h.get("/metrics")  # (nothing finished yet: an empty drain)
        first, _ = await run_round(h, 2)
        stat, m = await run_round(h, 4)
    spec = stat["specDecodingStats"]
    drafts, accepted, steps = (spec["numDraftTokens"], spec["numAcceptedTokens"],
                               spec["numRequestsWithDraftTokens"])
    assert steps > 0 and drafts == K * steps  # a chain: K drafts each verification
    assert 0 < accepted < drafts  # acceptance 0.6: some of them, not all
    assert spec["acceptanceLength"] == pytest.approx((accepted + steps) / steps, rel=1e-12)
    # the draft passes' share of the window: its latency over the iteration's, from the cost
    # model (a one-layer EAGLE head against 32 layers: a part, not nothing, not all)
    assert 0 < spec["draftOverhead"] < 0.5
    assert spec["iterLatencyMS"] == pytest.approx(spec["draftOverhead"] * stat["iterLatencyMS"],
                                                  rel=1e-9)
    # an entry counts its window's steps; the counters sum the windows
    earlier = first["specDecodingStats"]
    for key, name in (("numDraftTokens", "trtllm_spec_decode_num_draft_tokens"),
                      ("numAcceptedTokens", "trtllm_spec_decode_num_accepted_tokens")):
        assert earlier[key] + spec[key] == total(m, name), key

    drafted = {s.labels["token_position"]: s.value
               for s in m["trtllm_spec_decode_drafted_tokens"]}
    by_pos = {s.labels["token_position"]: s.value
              for s in m["trtllm_spec_decode_accepted_tokens"]}
    assert sorted(drafted) == [str(i) for i in range(K)]
    # every verification step drafts once at each position; the totals are the positions' sums
    assert set(drafted.values()) == {total(m, "trtllm_spec_decode_num_draft_tokens") / K}
    assert total(m, "trtllm_spec_decode_num_accepted_tokens") == sum(by_pos.values()) > 0
    # a chain accepts position i only after position i - 1
    assert [by_pos.get(str(i), 0) for i in range(K)] == sorted(by_pos.values(), reverse=True)
    (length,) = m["trtllm_spec_decode_acceptance_length"]
    (overhead,) = m["trtllm_spec_decode_draft_overhead"]
    assert (length.value, overhead.value) == (spec["acceptanceLength"], spec["draftOverhead"])
    (info,) = m["trtllm_speculative_config_info"]
    assert {k: info.labels[k] for k in ("spec_enabled", "spec_method", "spec_num_tokens",
                                        "spec_draft_model")} == {
        "spec_enabled": "true", "spec_method": "Eagle3", "spec_num_tokens": str(K),
        "spec_draft_model": DRAFT}
    await pod_released(pod)
