"""An embedding model's vLLM pod (`vllm serve Qwen/Qwen3-Embedding-0.6B`), driven by the
official `openai` client and plain HTTP: `/v1/embeddings` (float, base64 in every
`embed_dtype`, bytes), `/pooling`, `/score` and `/rerank` (the bi-encoder: cosine of the two
vectors) in vLLM 0.33.0's shapes; vLLM's refusals with its words; no generation route; vLLM's
metrics counting each pooled prompt (its TTFT is its prefill); every request released."""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import openai
import pytest
from http_helpers import pod_released, sample_sum
from server_proc import ServerProcess

from clients.client import AsyncClient

REPO = "Qwen/Qwen3-Embedding-0.6B"
SIZE = 1024  # its hidden size: the vector's length


@pytest.fixture(scope="module")
def server():
    with ServerProcess(None, REPO, "--max-model-len", "512", "--time-scale", "0.05",
                       vllm=True) as server:
        yield server




async def embed(http, **body) -> dict:
    r = await http.post("/v1/embeddings", json={"model": REPO, **body})
    assert r.status_code == 200, r.text
    return r.json()



async def test_the_openai_client_gets_one_unit_vector_per_input(server):
    oai = openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="none")
    texts = ["the cat sat on the mat", "the cat sat on a mat", "quarterly revenue fell"]
    r = await oai.embeddings.create(model=REPO, input=texts)  # (asks base64, decodes it)
    assert r.object == "list" and r.model == REPO and [d.index for d in r.data] == [0, 1, 2]
    vectors = [np.asarray(d.embedding) for d in r.data]
    assert all(v.shape == (SIZE,) and math.isclose(np.linalg.norm(v), 1, rel_tol=1e-5)
               for v in vectors)
    # texts sharing words are closer than unrelated ones (the emulated vectors' one promise)
    assert vectors[0] @ vectors[1] > 0.6 > vectors[0] @ vectors[2]
    again = await oai.embeddings.create(model=REPO, input=texts[0], encoding_format="float")
    assert np.allclose(again.data[0].embedding, vectors[0], atol=1e-7)  # deterministic
    tokens = sum([(await oai.post("/../tokenize", body={"prompt": t}, cast_to=object))["count"]
                  for t in texts])
    assert r.usage.prompt_tokens == r.usage.total_tokens == tokens
    await pod_released(server)


async def test_float_base64_and_bytes_carry_the_same_vector(http):
    as_float = np.asarray((await embed(http, input="hello there"))["data"][0]["embedding"],
                          np.float32)
    for dtype, np_dtype, tol in (("float32", "<f4", 0), ("float16", "<f2", 1e-3)):
        got = (await embed(http, input="hello there", encoding_format="base64",
                           embed_dtype=dtype, endianness="little"))["data"][0]["embedding"]
        assert np.allclose(np.frombuffer(base64.b64decode(got), np_dtype), as_float, atol=tol)
    big = (await embed(http, input="hello there", encoding_format="base64",
                       endianness="big"))["data"][0]["embedding"]
    assert np.array_equal(np.frombuffer(base64.b64decode(big), ">f4"), as_float)
    bf16 = (await embed(http, input="hello there", encoding_format="base64",
                        embed_dtype="bfloat16"))["data"][0]["embedding"]
    widened = (np.frombuffer(base64.b64decode(bf16), "<u2").astype(np.uint32) << 16).view("<f4")
    assert np.allclose(widened, as_float, rtol=1 / 128)
    for fp8 in ("fp8_e4m3", "fp8_e5m2"):
        raw = base64.b64decode((await embed(http, input="hello there", encoding_format="base64",
                                            embed_dtype=fp8))["data"][0]["embedding"])
        assert len(raw) == SIZE
    r = await http.post("/v1/embeddings", json={"input": ["a b", "c d e"],
                                                "encoding_format": "bytes"})
    assert r.headers["content-type"] == "application/octet-stream"
    meta = json.loads(r.headers["metadata"])
    assert [(d["start"], d["end"], d["shape"]) for d in meta["data"]] == [
        (0, 4 * SIZE, [SIZE]), (4 * SIZE, 8 * SIZE, [SIZE])]
    assert len(r.content) == 8 * SIZE and meta["usage"]["prompt_tokens"] > 0
    only = await http.post("/v1/embeddings", json={"input": ["a b", "c d e"],
                                                   "encoding_format": "bytes_only"})
    assert "metadata" not in only.headers and only.content == r.content


async def test_chat_input_token_ids_truncation_and_raw_vectors(http):
    chat = await embed(http, messages=[{"role": "user", "content": "hello"}])
    as_input = await embed(http, input=[{"role": "user", "content": "hello"}])
    assert chat["data"][0]["embedding"] == as_input["data"][0]["embedding"]
    ids = await embed(http, input=[[5, 6, 7, 8], [9, 10]])
    # vLLM 0.34.0's UsageInfo: prompt_tokens_details, None in a pooling answer, is left out
    assert ids["usage"] == {"prompt_tokens": 6, "total_tokens": 6, "completion_tokens": 0,
                            "completion_tokens_details": None}
    full = await embed(http, input=[list(range(1000, 1512))])  # fills the context of 512
    assert full["usage"]["prompt_tokens"] == 512
    cut = await embed(http, input=" ".join(["word"] * 100), truncate_prompt_tokens=10)
    assert cut["usage"]["prompt_tokens"] == 10
    raw = await embed(http, input="hello there", use_activation=False)
    assert not math.isclose(np.linalg.norm(raw["data"][0]["embedding"]), 1, rel_tol=1e-3)
    pooled = await http.post("/pooling", json={"input": "hello there"})
    assert pooled.status_code == 200
    body = pooled.json()
    assert body["id"].startswith("pool-") and body["data"][0]["object"] == "pooling"
    assert body["data"][0]["data"] == (await embed(http, input="hello there")
                                       )["data"][0]["embedding"]


@pytest.mark.parametrize("body, status, says", [
    ({"input": "x", "dimensions": 8}, 400,
     f"Model '{REPO}' does not support Matryoshka embeddings; dimensions must be unset "
     "(received dimensions=8)."),
    ({"input": []}, 400, "You must pass at least one prompt"),
    ({"input": "x", "normalize": True}, 400,
     "Parameter `normalize` was removed; use `use_activation` instead."),
    ({"input": "x", "task": "encode"}, 400, "`encode` task was removed"),
    ({"input": "word " * 600}, 400, "This model's maximum context length is 512 tokens"),
    ({"input": "x", "truncate_prompt_tokens": 513}, 400,
     "truncate_prompt_tokens value is greater than max_model_len"),
    ({"input": [99999999]}, 400, "out of vocabulary"),
    ({"input": 3}, 400, "input"),
    ({"input": "x", "encoding_format": "hex"}, 400, "encoding_format"),
])
async def test_bad_embedding_requests_get_vllms_answer(http, server, body, status, says):
    r = await http.post("/v1/embeddings", json=body)
    assert r.status_code == status and says in r.json()["error"]["message"], r.text
    await pod_released(server)


async def test_pooling_refuses_dimensions_and_other_tasks(http):
    r = await http.post("/pooling", json={"input": "x", "dimensions": 4})
    assert r.status_code == 400 and "dimensions is currently not supported" in r.text
    r = await http.post("/pooling", json={"input": "x", "task": "classify"})
    assert r.status_code == 400 and "Unsupported task: 'classify'" in r.text


async def test_rerank_sorts_by_the_cosine_and_keeps_top_n(http, server):
    docs = ["stock markets fell sharply", "the cat sat on the mat", "a cat on a mat"]
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        r = await http.post(path, json={"query": "cat on the mat", "documents": docs,
                                        "top_n": 2})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["id"].startswith("score-") and body["model"] == REPO
        results = body["results"]
        assert len(results) == 2 and results[0]["index"] in (1, 2)
        assert results[0]["relevance_score"] >= results[1]["relevance_score"]
        assert results[0]["document"] == {"text": docs[results[0]["index"]],
                                          "multi_modal": None}
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    q = np.asarray((await embed(http, input="cat on the mat"))["data"][0]["embedding"])
    d = np.asarray((await embed(http, input=docs[1]))["data"][0]["embedding"])
    full = (await http.post("/rerank", json={"query": "cat on the mat",
                                             "documents": docs})).json()["results"]
    assert len(full) == 3
    score = next(x["relevance_score"] for x in full if x["index"] == 1)
    assert score == pytest.approx(float(q @ d), abs=1e-6)
    await pod_released(server)


@pytest.mark.parametrize("names", [("queries", "documents"), ("queries", "items"),
                                   ("data_1", "data_2"), ("text_1", "text_2")])
async def test_score_pairs_one_to_n_and_n_to_n(http, names):
    a, b = names
    one = await http.post("/score", json={a: "cat", b: ["cat", "dog", "cat cat"]})
    assert one.status_code == 200, one.text
    scores = [d["score"] for d in one.json()["data"]]
    assert len(scores) == 3 and scores[0] == pytest.approx(1.0)
    pairs = await http.post("/v1/score", json={a: ["cat", "dog"], b: ["cat", "cat"]})
    assert [d["index"] for d in pairs.json()["data"]] == [0, 1]
    assert pairs.json()["data"][0]["score"] == pytest.approx(1.0)
    bad = await http.post("/score", json={a: ["a", "b"], b: ["a", "b", "c"]})
    assert bad.status_code == 400 and "Input lengths must be either 1:1, 1:N or N:N" in bad.text
    mm = await http.post("/score", json={a: "a", b: {"content": []}})
    assert mm.status_code == 400 and "MultiModalParam is not supported" in mm.text


async def test_a_pooling_pod_mounts_no_generation_route(http):
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"):
        assert (await http.post(path, json={"prompt": "x"})).status_code == 404, path
    assert (await http.post("/tokenize", json={"prompt": "x"})).status_code == 200


async def test_grpc_generation_of_an_embedding_model_is_invalid(server):
    import grpc

    async with AsyncClient(server.target) as client:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in client.generate("hello", max_tokens=4):
                pass
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "This model does not support generation" in refused.value.details()


async def test_metrics_count_each_pooled_prompt(http, server):
    before = server.scrape()
    await embed(http, input=["one two three", "four five", "six"])
    after = server.scrape()
    gained = {n: sample_sum(after, n) - sample_sum(before, n) for n in (
        "vllm:request_success_total", "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
        "vllm:prompt_tokens_total", "vllm:time_to_first_token_seconds_sum")}
    assert gained["vllm:request_success_total"] == 3
    assert gained["vllm:generation_tokens_total"] == 0
    assert gained["vllm:time_to_first_token_seconds_count"] == 3  # the vector is its output
    assert gained["vllm:e2e_request_latency_seconds_count"] == 3
    assert gained["vllm:prompt_tokens_total"] >= 6
    assert gained["vllm:time_to_first_token_seconds_sum"] > 0
    await pod_released(server)


async def test_sagemaker_invocations_answer_pooling_bodies(http):
    emb = await http.post("/invocations", json={"input": "hello there"})
    assert emb.status_code == 200 and emb.json()["data"][0]["object"] == "embedding"
    assert emb.json()["data"][0]["embedding"] == (await embed(http, input="hello there")
                                                  )["data"][0]["embedding"]
    rr = await http.post("/invocations", json={"query": "cat", "documents": ["cat", "dog"]})
    assert rr.status_code == 200 and rr.json()["results"][0]["index"] == 0
    sc = await http.post("/invocations", json={"queries": "cat", "documents": ["cat"]})
    assert sc.status_code == 200 and sc.json()["data"][0]["object"] == "score"
    no = await http.post("/invocations", json={"prompt": "hi", "max_tokens": 2})
    assert no.status_code == 400 and "Expected one of: ['EmbeddingRequest', 'RerankRequest', " \
        "'ScoreRequest', 'PoolingRequest']" in no.text


async def test_vllm_engine_embed_is_what_smg_calls(server, http):
    import grpc
    from smg_grpc_proto import vllm_engine_pb2 as vpb
    from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc

    tokens = (await http.post("/tokenize", json={"prompt": "hello there"})).json()["tokens"]
    async with grpc.aio.insecure_channel(server.target) as channel:
        stub = vpb_grpc.VllmEngineStub(channel)
        info = await stub.GetModelInfo(vpb.GetModelInfoRequest())
        assert info.is_generation is False  # a router sends this worker embeddings
        r = await stub.Embed(vpb.EmbedRequest(request_id="e1", tokenized=vpb.TokenizedInput(
            original_text="hello there", input_ids=tokens)))
        assert r.embedding_dim == SIZE == len(r.embedding) and r.prompt_tokens == len(tokens)
        assert np.allclose(r.embedding, (await embed(http, input="hello there")
                                         )["data"][0]["embedding"], atol=1e-6)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Embed(vpb.EmbedRequest(request_id="e2"))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "requires tokenized input" in refused.value.details()
    await pod_released(server)


async def test_cohere_v2_embed(http, server):
    text = "hello there general kenobi"
    mine = (await embed(http, input=text))
    r = await http.post("/v2/embed", json={"texts": [text], "embedding_types": [
        "base64", "ubinary", "float", "binary"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body) == ["id", "embeddings", "texts", "meta", "response_type"]
    assert body["id"].startswith("embd-") and body["texts"] == [text]
    assert body["response_type"] == "embeddings_by_type"
    assert body["meta"] == {"api_version": {"version": "2"}, "billed_units": {
        "input_tokens": mine["usage"]["prompt_tokens"], "image_tokens": 0}}
    e = body["embeddings"]
    assert list(e) == ["float", "binary", "ubinary", "base64"]  # vLLM's fields' order
    v = np.asarray(e["float"][0])
    assert np.allclose(v, mine["data"][0]["embedding"], atol=1e-7)
    assert np.array_equal(np.frombuffer(base64.b64decode(e["base64"][0]), "<f4"),
                          v.astype(np.float32))
    packed = np.packbits(v >= 0)
    assert e["ubinary"][0] == packed.tolist() and len(packed) == SIZE // 8
    assert e["binary"][0] == (packed.astype(int) - 128).tolist()
    # input_type: the model's instruction for queries, none for documents
    query = (await http.post("/v2/embed", json={"texts": [text], "input_type": "query"})).json()
    doc = (await http.post("/v2/embed", json={"texts": [text], "input_type": "document"})).json()
    assert doc["embeddings"]["float"] == [v.tolist()] and "texts" in doc
    assert query["embeddings"]["float"] != doc["embeddings"]["float"]
    assert query["meta"]["billed_units"]["input_tokens"] > 15  # the instruction's tokens too
    parts = await http.post("/v2/embed", json={"inputs": [{"content": [
        {"type": "text", "text": text}]}]})
    assert parts.status_code == 200 and "texts" not in parts.json()
    await pod_released(server)


async def test_cohere_truncation(http):
    long = " ".join(f"w{i}" for i in range(60))
    end = (await http.post("/v2/embed", json={"texts": [long], "max_tokens": 8})).json()
    start = (await http.post("/v2/embed", json={"texts": [long], "max_tokens": 8,
                                                "truncate": "START"})).json()
    assert end["meta"]["billed_units"]["input_tokens"] == 8
    assert start["meta"]["billed_units"]["input_tokens"] == 8
    assert end["embeddings"]["float"] != start["embeddings"]["float"]  # first 8 vs last 8
    whole = await http.post("/v2/embed", json={"texts": [long], "truncate": "NONE"})
    assert whole.status_code == 200
    none = await http.post("/v2/embed", json={"texts": [long], "max_tokens": 8,
                                              "truncate": "NONE"})
    assert none.status_code == 400 and "with truncate=NONE. Set truncate to END or START" \
        in none.text


@pytest.mark.parametrize("body, says", [
    ({"texts": []}, "Exactly one of texts, images, or inputs must be provided"),
    ({"texts": ["a"], "images": ["data:image/png;base64,AA=="]}, "Exactly one of texts"),
    ({"images": ["data:image/png;base64,AA=="]}, "images are not supported"),
    ({"texts": ["a"], "input_type": "search"},
     "Unsupported input_type 'search'. Supported values: document, query"),
    ({"texts": ["a"], "output_dimension": 64}, "does not support Matryoshka embeddings"),
    ({"texts": ["a"], "embedding_types": ["int8"]}, "embedding_types"),
    ({"inputs": [{"content": [{"type": "text"}]}]}, "type='text' requires text"),
])
async def test_bad_cohere_requests_get_vllms_answer(http, server, body, says):
    r = await http.post("/v2/embed", json=body)
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    await pod_released(server)
