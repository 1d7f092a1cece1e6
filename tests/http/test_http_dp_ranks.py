"""A pod that runs some data-parallel ranks of a MoE model's expert-parallel group, as one
node of llm-d's wide-EP deployment does (`vllm serve Qwen/Qwen3-30B-A3B -dp 4
--data-parallel-size-local 2 --data-parallel-start-rank 2`): its engines are labelled with
their ranks (2 and 3), each holds the KV cache one rank of the group holds (the experts
sharded over all four ranks' chips), both serve, and every request releases what it held;
over gRPC (smg's VllmEngine) the pod reports the group's size and one load per rank it runs."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import pytest
from fleets import assert_released, vllm_pod_options
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc

from clients.client import AsyncClient
from devices import place

REPO = "Qwen/Qwen3-30B-A3B"
# 16-token blocks pinned (vLLM 0.34.0's default on this chip is 64): the hit-rate test's
# 64-token prompt finds 48 tokens (3 whole blocks) cached the second time
BLOCK = 16
ARGV = ("-dp", "4", "--data-parallel-size-local", "2", "--data-parallel-start-rank", "2",
        "--max-model-len", "4k", "--block-size", str(BLOCK))


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, REPO, *ARGV, "--time-scale", "0.05", vllm=True) as server:
        yield server


def samples(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name]


async def test_the_pod_runs_ranks_2_and_3_each_with_one_ranks_share_of_the_group(pod):
    info = samples(pod.scrape(), "vllm:cache_config_info")
    assert sorted(s.labels["engine"] for s in info) == ["2", "3"]
    d = vllm_pod_options(REPO, *ARGV)
    rank, copy = place(d.spec(), ranks=4), place(d.spec())
    assert {s.labels["block_size"] for s in info} == {str(BLOCK)}
    blocks = {int(s.labels["num_gpu_blocks"]) for s in info}
    assert blocks == {rank.kv_blocks(BLOCK)}
    assert rank.kv_blocks(BLOCK) > 2 * copy.kv_blocks(BLOCK)  # the experts' memory held KV instead


async def test_both_ranks_serve_and_release_everything(pod):
    body = {"model": REPO, "prompt": "the same short prompt", "max_tokens": 6}
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=60) as http:
        answers = await asyncio.gather(*(http.post("/v1/completions", json=body)
                                         for _ in range(8)))
    assert [r.status_code for r in answers] == [200] * 8
    assert all(r.json()["usage"]["completion_tokens"] == 6 for r in answers)
    done = {s.labels["engine"]: s.value
            for s in samples(pod.scrape(), "vllm:request_success_total")
            if s.labels.get("finished_reason") == "length"}
    assert sum(done.values()) == 8 and set(done) == {"2", "3"}
    async with AsyncClient(pod.target) as c:
        await assert_released(c, (await c.list_deployments()).deployments[0].name)


async def test_smg_sees_the_groups_size_and_a_load_per_rank_here(pod):
    async with grpc.aio.insecure_channel(pod.target) as channel:
        stub = vpb_grpc.VllmEngineStub(channel)
        info = await stub.GetServerInfo(vpb.GetServerInfoRequest())
        loads = await stub.GetLoads(vpb.GetLoadsRequest())
    assert info.data_parallel_size == 4 and info.kv_cache_dtype == "auto"
    assert loads.dp_rank_count == 2 and [x.dp_rank for x in loads.loads] == [2, 3]
    tokens = place(vllm_pod_options(REPO, *ARGV).spec(), ranks=4).kv_blocks(BLOCK) * BLOCK
    assert all(x.max_total_num_tokens == tokens for x in loads.loads)


async def test_each_ranks_load_has_its_own_cache_hit_rate(pod):
    """The same 64-token prompt twice on the pod's first rank (the second finds 48 tokens
    cached: whole blocks, the last prompt token recomputed): that rank's hit rate is what its
    answers say; the second rank served nothing over gRPC (only this test sends there)."""
    prompt = list(range(1000, 1064))
    cached = prompted = 0
    async with grpc.aio.insecure_channel(pod.target) as channel:
        stub = vpb_grpc.VllmEngineStub(channel)
        for i in range(2):
            request = vpb.GenerateRequest(
                request_id=f"hit-{i}", tokenized=vpb.TokenizedInput(input_ids=prompt),
                sampling_params=vpb.SamplingParams(max_tokens=2), data_parallel_rank=0)
            done = [r async for r in stub.Generate(request)][-1].complete
            cached, prompted = cached + done.cached_tokens, prompted + done.prompt_tokens
        first, second = (await stub.GetLoads(vpb.GetLoadsRequest())).loads
    assert cached == 48 and prompted == 128
    assert first.cache_hit_rate == pytest.approx(cached / prompted)
    assert second.cache_hit_rate == 0.0
