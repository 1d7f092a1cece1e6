"""vLLM series whose values follow from a known load: by-source prompt counters, admission
rejections, per-request preemptions, speculative decoding, and the 0.11.x names behind
`show_hidden_metrics_for_version`."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from fleets import TEST_FLEET, fleet_doc
from server_proc import ServerProcess, metric, until

from clients.client import AsyncClient, build_request


async def test_prompt_sources_rejections_and_hidden_names():
    doc = fleet_doc({"show_hidden_metrics_for_version": "0.10"})
    prompt = list(range(100, 200))  # 100 tokens: the second time, 96 come from the cache
    with ServerProcess(doc) as server:
        async with AsyncClient(server.target) as client:
            for _ in range(2):
                [c async for c in client.generate(prompt, max_tokens=3, ignore_eos=True)]
            # 'slow' runs one and queues two: the fourth is refused by the queue limit
            def held():
                return client.stub.Generate(build_request(
                    "q", deployment="slow", max_tokens=500, ignore_eos=True))

            calls = [held()]
            await until(client, "slow", lambda d: d.load.num_running == 1)
            calls += [held(), held()]
            await until(client, "slow",
                        lambda d: (d.load.num_running, d.load.num_waiting) == (1, 2))
            with pytest.raises(grpc.aio.AioRpcError):
                async for _ in client.generate("refused", deployment="slow", max_tokens=2):
                    pass
            text = await asyncio.to_thread(server.scrape)
            for call in calls:
                call.cancel()
    fast = {"deployment": "fast"}
    assert metric(text, "vllm:prompt_tokens_total", **fast) == 200
    assert metric(text, "vllm:prompt_tokens_cached_total", **fast) == 96
    assert metric(text, "vllm:prompt_tokens_by_source_total", source="local_cache_hit",
                  **fast) == 96
    assert metric(text, "vllm:prompt_tokens_by_source_total", source="local_compute",
                  **fast) == 104
    assert metric(text, "vllm:prompt_tokens_cached_by_source_total", source="device",
                  **fast) == metric(text, "vllm:prefix_cache_hits_total", **fast) == 96
    assert metric(text, "vllm:request_prefill_kv_computed_tokens_sum", **fast) == 104
    assert metric(text, "vllm:admission_rejections_total", deployment="slow",
                  reason="max_num_queued_reqs") == 1
    assert 'vllm:admission_rejections_total{deployment="slow",model_name=' in text  # no engine
    assert metric(text, "vllm:num_requests_waiting_by_reason", deployment="slow",
                  reason="capacity") == 2
    assert metric(text, "vllm:engine_sleep_state", sleep_state="awake", **fast) == 1
    # vLLM 0.11.x's deprecated names mirror the current ones
    assert metric(text, "vllm:gpu_prefix_cache_hits_total", **fast) == 96
    assert metric(text, "vllm:gpu_prefix_cache_queries_total", **fast) == metric(
        text, "vllm:prefix_cache_queries_total", **fast)
    assert metric(text, "vllm:gpu_cache_usage_perc", deployment="slow") == metric(
        text, "vllm:kv_cache_usage_perc", deployment="slow") > 0


async def test_hidden_names_only_when_asked():
    with ServerProcess(TEST_FLEET) as server:
        text = await asyncio.to_thread(server.scrape)
    assert "vllm:gpu_cache_usage_perc" not in text and "vllm:kv_cache_usage_perc" in text


async def test_speculative_decoding_counters():
    spec = '{"method": "eagle3", "num_speculative_tokens": 3, "acceptance_rate": 0.7}'
    eagle = {**TEST_FLEET["deployments"][0], "name": "eagle", "speculative_config": spec}
    with ServerProcess(fleet_doc(deployments=[eagle])) as server:
        async with AsyncClient(server.target) as client:
            chunks = [c async for c in client.generate("draft", max_tokens=60, ignore_eos=True)]
        text = await asyncio.to_thread(server.scrape)
    assert chunks[-1].final.usage.completion_tokens == 60
    lab = {"deployment": "eagle"}
    drafts = metric(text, "vllm:spec_decode_num_drafts_total", **lab)
    proposed = metric(text, "vllm:spec_decode_num_draft_tokens_total", **lab)
    accepted = metric(text, "vllm:spec_decode_num_accepted_tokens_total", **lab)
    per_pos = [metric(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                      position=str(i), **lab) for i in range(3)]
    assert proposed == 3 * drafts and 0 < accepted < proposed
    assert per_pos == sorted(per_pos, reverse=True) and sum(per_pos) == accepted
    # every step yields 1 + accepted tokens: 60 tokens in fewer steps than tokens
    assert drafts + accepted >= 59 and drafts < 59
