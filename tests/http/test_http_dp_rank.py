"""A router pins a request to one engine core of a data-parallel pod, as vLLM's
`X-data-parallel-rank` header and VllmEngine's `data_parallel_rank` field do: the request runs
on that rank (its metrics and its prefix cache), a rank out of range is vLLM's 400 /
INVALID_ARGUMENT, and a header that is not an integer is ignored, as vLLM ignores it."""

from __future__ import annotations

import grpc
import httpx
import pytest
from http_helpers import http_client
from server_proc import ServerProcess, metric
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc

MODEL = "llama-3.1-8b"
# 16-token blocks pinned (vLLM 0.34.0's default on this chip is 64): PROMPT is ten of them,
# nine whole ones a repeat finds cached (its last token is recomputed)
POD = ["--chip", "h100-sxm", "--engine", "vllm", "--model", MODEL, "--quant", "fp8",
       "--max-model-len", "512", "--data-parallel-size", "2", "--block-size", "16",
       "--time-scale", "0.05"]
PROMPT = [(17 * i) % 3000 + 300 for i in range(160)]  # ten full KV blocks


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *POD) as s:
        yield s


def successes(text: str, rank: int) -> float:
    return metric(text, "vllm:request_success_total", engine=str(rank), finished_reason="length")


async def completion(http: httpx.AsyncClient, rank: str | None, prompt=PROMPT) -> dict:
    headers = {"X-data-parallel-rank": rank} if rank is not None else {}
    r = await http.post("/v1/completions", json={"model": MODEL, "prompt": prompt,
                                                 "max_tokens": 2, "ignore_eos": True},
                        headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


async def test_a_pinned_request_runs_on_its_rank(pod):
    async with http_client(pod) as http:
        before = [successes(pod.scrape(), r) for r in (0, 1)]
        for i in range(6):
            await completion(http, "1", [5 + i] * 20)
        r = await http.post("/v1/chat/completions", headers={"X-data-parallel-rank": "1"},
                            json={"messages": [{"role": "user", "content": "Hi"}],
                                  "max_tokens": 2, "ignore_eos": True})
        assert r.status_code == 200
        after = [successes(pod.scrape(), r) for r in (0, 1)]
    assert after[0] == before[0] and after[1] - before[1] == 7


async def test_each_rank_has_its_own_prefix_cache(pod):
    async with http_client(pod) as http:
        first = await completion(http, "0")
        again = await completion(http, "0")
        other = await completion(http, "1")
    cached = [c["usage"]["prompt_tokens_details"]["cached_tokens"] for c in (first, again, other)]
    assert cached[0] == 0 and cached[1] >= 144 and cached[2] == 0  # (rank 1 never saw it)


async def test_out_of_range_and_malformed_ranks(pod):
    async with http_client(pod) as http:
        r = await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2},
                            headers={"X-data-parallel-rank": "2"})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "data_parallel_rank 2 is out of range [0, 2)."
        await completion(http, "one")  # not an integer: ignored, as vLLM ignores it
    async with grpc.aio.insecure_channel(pod.target) as channel:
        stub = vpb_grpc.VllmEngineStub(channel)
        request = vpb.GenerateRequest(
            request_id="pinned", tokenized=vpb.TokenizedInput(input_ids=[1, 2, 3]),
            sampling_params=vpb.SamplingParams(max_tokens=2), data_parallel_rank=7)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            async for _ in stub.Generate(request):
                pass
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "data_parallel_rank 7 is out of range [0, 2)." in (e.value.details() or "")
