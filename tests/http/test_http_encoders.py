"""Encoder pods, started as vLLM's users start them (`vllm serve BAAI/bge-reranker-v2-m3`,
`vllm serve BAAI/bge-m3`): a native cross-encoder tokenizes each (query, document) as a pair
with the tokenizer's separators; the pod keeps no KV cache (one null block, usage 0), looks
nothing up in a prefix cache and computes every prompt whole, every time; vLLM's clients
(openai, AIPerf's cohere-rankings) run against it; every request is released."""

from __future__ import annotations

import pytest
from http_helpers import aiperf_rankings, pod_released, sample_sum
from server_proc import ServerProcess

from clients.client import AsyncClient
from server.engine.tokenizer import get_tokenizer

RERANKER = "BAAI/bge-reranker-v2-m3"
QUERY = "which planet is the largest in the solar system?"
DOCS = ["Jupiter is the largest planet in the solar system.", "Cats sleep a lot.",
        "The largest planet, Jupiter, is a gas giant."]


@pytest.fixture(scope="module")
def server():
    with ServerProcess(None, RERANKER, "--time-scale", "0.05", vllm=True) as server:
        yield server


def counter(server, name: str) -> float:
    return sample_sum(server.scrape(), name)


async def test_rerank_pools_each_pair_tokenized_as_a_pair(http, server):
    r = await http.post("/rerank", json={"model": RERANKER, "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["index"] for x in body["results"]][-1] == 1  # the unrelated document last
    tok = get_tokenizer()
    pairs = [tok.encode_pair(QUERY, d) for d in DOCS]
    assert all(p.count(tok.bos_token_id) == 2 for p in pairs)  # <bos> query <bos> document
    assert body["usage"]["prompt_tokens"] == sum(map(len, pairs))
    score = await http.post("/score", json={"text_1": QUERY, "text_2": DOCS[0]})
    assert score.status_code == 200 and 0 < score.json()["data"][0]["score"] <= 1
    await pod_released(server)


async def test_the_pod_keeps_no_kv_cache_and_computes_every_prompt_whole(http, server):
    text = server.scrape()
    assert 'num_gpu_blocks="1"' in text and 'enable_prefix_caching="False"' in text
    before = {n: counter(server, n) for n in (
        "vllm:prompt_tokens_total", "vllm:prompt_tokens_cached_total",
        "vllm:prefix_cache_queries_total", "vllm:request_success_total")}
    for _ in range(3):  # the same call again: nothing is cached between them
        r = await http.post("/rerank", json={"query": QUERY * 20, "documents": DOCS})
        assert r.status_code == 200, r.text
    after = {n: counter(server, n) for n in before}
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 9
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] \
        == 3 * r.json()["usage"]["prompt_tokens"]
    assert after["vllm:prompt_tokens_cached_total"] == before["vllm:prompt_tokens_cached_total"]
    assert after["vllm:prefix_cache_queries_total"] == before["vllm:prefix_cache_queries_total"]
    assert counter(server, "vllm:kv_cache_usage_perc") == 0.0
    async with AsyncClient(server.target) as client:  # no KV bounds the concurrency
        (d,) = (await client.list_deployments()).deployments
    assert d.capacity.kv_blocks_total == 1
    assert d.capacity.max_concurrency == d.capacity.max_num_seqs > 1
    await pod_released(server)


async def test_a_prompt_as_long_as_the_context_is_pooled_whole(http, server):
    # no KV blocks to count: a prompt of the whole context is admitted (the pool is 1 block)
    r = await http.post("/classify", json={"input": [[7] * 8192]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 8192
    too_long = await http.post("/classify", json={"input": [[7] * 8193]})
    assert too_long.status_code == 400 and "8192" in too_long.text
    await pod_released(server)


async def test_what_an_encoder_pod_refuses(http, server):
    emb = await http.post("/v1/embeddings", json={"input": "hi"})
    assert emb.status_code == 404  # a classifier's pod mounts no embedding route
    gen = await http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert gen.status_code == 404
    await pod_released(server)


def test_aiperf_rankings_against_an_encoder(server, tmp_path):
    n, passages = 8, 4
    before = counter(server, "vllm:request_success_total")
    cached = counter(server, "vllm:prompt_tokens_cached_total")
    aiperf_rankings(server, RERANKER, tmp_path, n, passages)
    assert counter(server, "vllm:request_success_total") - before == n * passages
    assert counter(server, "vllm:prompt_tokens_cached_total") == cached


def test_an_embedding_encoder_answers_openai_clients(tmp_path):
    import openai

    with ServerProcess(None, "BAAI/bge-m3", "--time-scale", "0.05", vllm=True) as pod:
        client = openai.OpenAI(base_url=pod.http_url + "/v1", api_key="x")
        models = client.models.list()
        assert [m.id for m in models.data] == ["BAAI/bge-m3"]
        out = client.embeddings.create(model="BAAI/bge-m3", input=["hello world", "hi"])
        assert [len(d.embedding) for d in out.data] == [1024, 1024]  # its hidden size
        again = client.embeddings.create(model="BAAI/bge-m3", input=["hello world", "hi"])
        assert again.data[0].embedding == out.data[0].embedding
        assert out.usage.prompt_tokens == again.usage.prompt_tokens > 0
        assert sample_sum(pod.scrape(), "vllm:prompt_tokens_cached_total") == 0
        assert sample_sum(pod.scrape(), "vllm:prompt_tokens_total") == 2 * out.usage.prompt_tokens
