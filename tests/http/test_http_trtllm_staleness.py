"""A TensorRT-LLM pod's iteration series are as fresh as a real trtllm-serve's: its collector
drains the iteration stats only when a request finishes, so a router scraping
`/prometheus/metrics` sees the queue of the last finish, not the present one, until the next
request ends. Walked through on one pod with one running slot, whose real queue the doppelchip
gRPC API reports (fresh) beside the trtllm_ gauges (held):

1. at start-up: idle gauges; no request series yet (a series appears once it is used);
2. one request runs, two wait — the gauges still say idle, the device series see the KV;
3. the running one is cancelled (not logged: TensorRT-LLM logs finished requests only), the
   next finishes, the last runs — the gauges jump to that moment, one request logged;
4. the last one is cancelled — the gauges still show it running until another request ends.
"""

from __future__ import annotations

import asyncio

import httpx
from http_helpers import first_data, pod_released
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess, until

from clients.client import AsyncClient

POD = ("--chip", "h100-sxm", "--engine", "tensorrt-llm", "--model", "llama-3.1-8b", "--quant",
       "fp8", "--max-model-len", "4096", "--max-num-seqs", "1", "--time-scale", "1",
       "--http-api", "trtllm", "--enable-metrics")
LONG = {"model": "m", "prompt": "Tell me a long story", "max_tokens": 3000, "ignore_eos": True,
        "stream": True}


def scrape(text: str) -> dict[str, float]:
    """Every sample's value by name (one series each on this pod, `_total` kept)."""
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


async def test_iteration_series_refresh_only_when_a_request_finishes():
    with ServerProcess(None, *POD) as pod:
        async with httpx.AsyncClient(base_url=pod.http_url, timeout=60) as h, \
                AsyncClient(pod.target) as grpc:
            name = (await grpc.list_deployments()).deployments[0].name

            async def metrics() -> dict[str, float]:
                return scrape((await h.get("/prometheus/metrics")).text)

            start = await metrics()
            assert start["trtllm_num_requests_running"] == 0
            assert start["trtllm_num_requests_waiting"] == 0
            assert "trtllm_request_success_total" not in start  # nothing logged yet
            assert "trtllm_num_requests_completed_total" not in start

            async with h.stream("POST", "/v1/completions", json=LONG) as first:
                running = first.aiter_lines()  # (kept: a dropped iterator closes the stream)
                await first_data(running)
                short = asyncio.create_task(h.post("/v1/completions", json={
                    "model": "m", "prompt": "Hi", "max_tokens": 2, "ignore_eos": True}))
                await until(grpc, name, lambda d: d.load.num_waiting == 1)  # queued first
                async with h.stream("POST", "/v1/completions", json=LONG) as last:
                    lines = last.aiter_lines()
                    await until(grpc, name, lambda d: d.load.num_running == 1
                                and d.load.num_waiting == 2)
                    held = await metrics()  # 1 running and 2 waiting, but none has finished
                    assert held["trtllm_num_requests_running"] == 0
                    assert held["trtllm_num_requests_waiting"] == 0
                    assert held["trtllm_kv_cache_used_blocks"] == 0
                    assert sum(v for k, v in held.items()
                               if k.startswith("doppelchip_kv_resident_bytes")) > 0

                    await first.aclose()  # cancelled: the short one runs, then the last
                    assert (await short).status_code == 200
                    await first_data(lines)
                    await until(grpc, name, lambda d: d.load.num_running == 1
                                and d.load.num_waiting == 0)
                    fresh = await metrics()
                    assert fresh["trtllm_num_requests_running"] == 1
                    assert fresh["trtllm_num_requests_waiting"] == 0
                    assert fresh["trtllm_kv_cache_used_blocks"] > 0
                    assert fresh["trtllm_num_requests_completed_total"] == 1
                    assert fresh['trtllm_request_success_total'] == 1  # the cancelled: none
            await pod_released(pod)
            stale = await metrics()  # the last one was cancelled: nothing finished since
            assert stale["trtllm_num_requests_running"] == 1
            r = await h.post("/v1/completions", json={"model": "m", "prompt": "Bye",
                                                      "max_tokens": 1})
            assert r.status_code == 200
            idle = await metrics()
            assert idle["trtllm_num_requests_running"] == 0
            assert idle["trtllm_kv_cache_used_blocks"] == 0
            assert idle["trtllm_num_requests_completed_total"] == 2
