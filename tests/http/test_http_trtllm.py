"""A TensorRT-LLM pod (`serve --http-api trtllm --enable-metrics`): trtllm-serve's OpenAI
server — `/health` (empty 200), `/version`, `/v1/models` owned by tensorrt_llm, the OpenAI
routes answering with the served name whatever `model` says and refusing in TensorRT-LLM's
flat `ErrorResponse`, `/metrics` as the iteration-stats JSON, `/perf_metrics`,
`/kv_cache_events` — and `/prometheus/metrics`, whose trtllm_ series follow the requests and
carry the labels llm-d's endpoint picker reads. Every request, however it ends, is released."""

from __future__ import annotations

import httpx
import pytest
from http_helpers import TOK, http_client, openai_client, pod_released
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess

from server.trtllm_servicer import TRTLLM_VERSION

POD = ("--chip", "h100-sxm", "--engine", "tensorrt-llm", "--model", "llama-3.1-8b", "--quant",
       "fp8", "--max-model-len", "2048", "--block-size", "32", "--time-scale", "0.05",
       "--served-model-name", "trt-llama", "--http-api", "trtllm", "--enable-metrics")


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *POD) as s:
        yield s


@pytest.fixture
async def h(pod):
    async with http_client(pod) as c:
        yield c


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def one(fams: dict, name: str) -> float:
    """The value of the single sample of family `name` (a counter's `_total` sample)."""
    (sample,) = [s for s in fams[name].samples if not s.name.endswith("_created")]
    return sample.value


async def test_health_version_and_models(h, pod):
    r = await h.get("/health")
    assert r.status_code == 200 and r.content == b""
    assert (await h.get("/version")).json() == {"version": TRTLLM_VERSION}
    models = (await h.get("/v1/models")).json()
    assert models["object"] == "list"
    (card,) = models["data"]
    assert card["id"] == "trt-llama" and card["owned_by"] == "tensorrt_llm"
    assert card["object"] == "model" and isinstance(card["created"], int)
    r = await h.get("/health_generate")
    assert r.status_code == 200 and r.text == "Generation health check OK"
    await pod_released(pod)


async def test_openai_routes_answer_with_the_served_name(pod):
    async with openai_client(pod) as client:
        done = await client.completions.create(model="anything", prompt="Hello there",
                                               max_tokens=6, extra_body={"ignore_eos": True})
        assert done.model == "trt-llama" and done.usage.completion_tokens == 6
        assert done.choices[0].finish_reason == "length"
        chat = await client.chat.completions.create(
            model="trt-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            extra_body={"ignore_eos": True}, stream=True)
        pieces = [c async for c in chat]
        assert pieces[-1].choices[0].finish_reason == "length"
    await pod_released(pod)


async def test_refusals_are_tensorrt_llms_flat_error(h, pod):
    r = await h.post("/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": -1})
    assert r.status_code == 400
    body = r.json()
    assert set(body) == {"object", "message", "type", "param", "code"}
    assert body["object"] == "error" and body["code"] == 400 and "max_tokens" in body["message"]
    r = await h.post("/v1/chat/completions", content=b"{not json",
                     headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["object"] == "error"
    r = await h.get("/no/such/route")
    assert r.status_code == 404 and r.json() == {"detail": "Not Found"}
    await pod_released(pod)


async def test_side_routes(h):
    assert (await h.get("/perf_metrics")).json() == []
    assert (await h.post("/kv_cache_events")).json() == []
    # vLLM's own routes are not a trtllm-serve pod's
    assert (await h.post("/tokenize", json={"prompt": "x"})).status_code == 404


async def test_prometheus_series_follow_requests_and_carry_the_pickers_labels(h, pod):
    before = families((await h.get("/prometheus/metrics")).text)
    prompt = "The quick brown fox jumps over the lazy dog " * 8
    for _ in range(2):  # the second one reuses the first one's prompt blocks
        r = await h.post("/v1/completions", json={"model": "m", "prompt": prompt,
                                                  "max_tokens": 5, "ignore_eos": True})
        assert r.status_code == 200, r.text
    after = families((await h.get("/prometheus/metrics")).text)

    def grown(name: str) -> float:
        return one(after, name) - (one(before, name) if name in before else 0.0)

    assert grown("trtllm_generation_tokens") == 10
    assert grown("trtllm_prompt_tokens") == 2 * (len(TOK.encode(prompt)) + 1)
    assert grown("trtllm_prompt_cached_tokens") > 0  # the second request's prefix hit
    assert grown("trtllm_num_requests_completed") == 2
    assert after["trtllm_kv_cache_hit_rate"].samples[0].value > 0
    # what llm-d's endpoint picker reads for engine type trtllm-serve, with its label sets
    for name in ("trtllm_num_requests_waiting", "trtllm_num_requests_running",
                 "trtllm_kv_cache_utilization", "trtllm_kv_cache_tokens_per_block",
                 "trtllm_kv_cache_max_blocks"):
        (sample,) = after[name].samples
        assert set(sample.labels) == {"engine_type", "model_name", "pid"}, name
        assert sample.labels["model_name"] == "trt-llama"
    assert one(after, "trtllm_kv_cache_tokens_per_block") == 32
    assert one(after, "trtllm_num_requests_running") == 0  # idle once both finished
    success = {s.labels["finished_reason"]: s.value
               for s in after["trtllm_request_success"].samples}
    assert success["length"] >= 2
    assert not any(n.startswith("vllm:") for n in after)  # TensorRT-LLM's names, not vLLM's
    assert not any("spec" in n for n in after)  # it does not speculate (test_http_trtllm_spec)
    await pod_released(pod)


async def test_metrics_is_the_iteration_stats_json(h, pod):
    await h.get("/metrics")  # drain what the other tests left
    assert (await h.get("/metrics")).json() == []  # nothing finished since
    r = await h.post("/v1/completions", json={"model": "m", "prompt": "Count to ten",
                                              "max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200
    (stat,) = (await h.get("/metrics")).json()
    assert stat["numCompletedRequests"] == 1 and stat["iter"] > 0
    kv = stat["kvCacheStats"]
    assert kv["tokensPerBlock"] == 32 and kv["freeNumBlocks"] + kv["usedNumBlocks"] == \
        kv["maxNumBlocks"]
    assert stat["maxNumTokensRuntime"] > 0 and stat["gpuMemUsage"] > 0
    assert "specDecodingStats" not in stat  # only a speculating pod's
    assert (await h.get("/metrics")).json() == []  # drained: TensorRT-LLM forgets it
    await pod_released(pod)


async def test_without_enable_metrics_nothing_is_mounted():
    args = [a for a in POD if a != "--enable-metrics"]
    with ServerProcess(None, *args) as s:
        async with httpx.AsyncClient(base_url=s.http_url, timeout=30) as h:
            assert (await h.get("/prometheus/metrics")).status_code == 404
            assert (await h.get("/metrics")).json() == []
            assert (await h.get("/health")).status_code == 200


async def test_api_key_guards_the_openai_routes_not_the_probes_or_metrics():
    with ServerProcess(None, *POD, "--api-key", "sesame") as s:
        async with httpx.AsyncClient(base_url=s.http_url, timeout=30) as h:
            body = {"model": "m", "prompt": "x", "max_tokens": 1}
            r = await h.post("/v1/completions", json=body)
            assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
            assert (await h.get("/v1/models")).status_code == 401
            r = await h.post("/v1/completions", json=body,
                             headers={"Authorization": "Bearer sesame"})
            assert r.status_code == 200
            for path in ("/health", "/version", "/metrics", "/prometheus/metrics"):
                assert (await h.get(path)).status_code == 200, path
