"""vLLM's queue limits on a real pod (`doppelchip vllm serve ... --max-num-queued-reqs 1`): a
request beyond them is refused with vLLM's 503 and words, so a router retries it on another
instance — over HTTP and gRPC — counted in `vllm:admission_rejections_total`,
and nothing of it is left behind; once the pod is idle again it serves."""

from __future__ import annotations

import grpc
import httpx
import pytest
from fleets import assert_released
from server_proc import ServerProcess, metric

from clients.client import AsyncClient, build_request
from server.engine.intake import QUEUE_OVERFLOW

REPO = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, REPO, "--max-model-len", "8k", "--max-num-queued-reqs", "1",
                       "--time-scale", "1", vllm=True) as server:
        yield server


async def test_a_request_past_max_num_queued_reqs_is_vllms_503(pod):
    body = {"model": REPO, "prompt": "hello", "max_tokens": 4}
    async with AsyncClient(pod.target) as c, \
            httpx.AsyncClient(base_url=pod.http_url, timeout=60) as http:
        name = (await c.list_deployments()).deployments[0].name
        long = c.stub.Generate(build_request("long", max_tokens=3000, ignore_eos=True))
        await long.read()  # admitted and running: the one request the limit allows
        r = await http.post("/v1/completions", json=body)
        assert r.status_code == 503
        assert r.json()["error"] == {"message": QUEUE_OVERFLOW, "type": "Service Unavailable",
                                     "param": None, "code": 503}
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in c.generate("also refused", max_tokens=2):
                pass
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert QUEUE_OVERFLOW in refused.value.details()
        assert metric(pod.scrape(), "vllm:admission_rejections_total",
                      reason="max_num_queued_reqs") == 2
        long.cancel()
        await assert_released(c, name)
        r = await http.post("/v1/completions", json=body)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
