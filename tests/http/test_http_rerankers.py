"""A cross-encoder's vLLM server, started with vLLM's documented command for Qwen3-Reranker
(`--hf-overrides` naming Qwen3ForSequenceClassification, `--chat-template` its template):
`/rerank` and `/score` render each (query, document) pair through the template and pool it
as one prompt; pairs of one call share the rendered query, which the prefix cache computes
once; `/classify` answers label probabilities; `/pooling` the classifier's output; the
embedding and generation routes are not mounted; every request is released."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from http_helpers import aiperf_rankings, pod_released, sample_sum
from server_proc import ServerProcess

from server.engine import score_template

REPO = "Qwen/Qwen3-Reranker-0.6B"
OVERRIDES = ('{"architectures": ["Qwen3ForSequenceClassification"], '
             '"classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true}')
TEMPLATE = Path(__file__).resolve().parents[2] / score_template.QWEN3_RERANKER_TEMPLATE
BLOCK = 16  # the deployment's KV block size (vLLM's default)


@pytest.fixture(scope="module")
def server():
    with ServerProcess(None, REPO, "--hf-overrides", OVERRIDES, "--chat-template",
                       str(TEMPLATE), "--max-model-len", "1024", "--time-scale", "0.05",
                       vllm=True) as server:
        yield server





async def tokens(http, text: str) -> list[int]:
    r = await http.post("/tokenize", json={"prompt": text})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def rendered(query: str, doc: str, **kwargs) -> str:
    return score_template.render(TEMPLATE.read_text(), query, doc, kwargs)


async def test_rerank_ranks_by_overlap_through_the_template(http, server):
    query = "where did the cat sit?"
    docs = ["Stock markets fell sharply on Monday.", "The cat sat on the mat.",
            "A cat sat on a mat in the sun."]
    r = await http.post("/rerank", json={"model": REPO, "query": query, "documents": docs})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("score-") and body["model"] == REPO
    order = [x["index"] for x in body["results"]]
    assert order[-1] == 0  # the unrelated document last
    scores = [x["relevance_score"] for x in body["results"]]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    # each pair is one prompt: the template with the query and the document in it
    expected = sum([len(await tokens(http, rendered(query, d))) for d in docs])
    assert body["usage"] == {"prompt_tokens": expected, "total_tokens": expected}
    top = (await http.post("/v1/rerank", json={"query": query, "documents": docs,
                                               "top_n": 1})).json()["results"]
    assert [x["index"] for x in top] == order[:1]
    await pod_released(server)


async def test_the_rendered_query_is_computed_once_per_call(http, server):
    query = "which planet is the largest in the solar system? " * 3
    docs = [f"document number {i} says something about topic {i * 7}" for i in range(8)]
    first, second = [await tokens(http, rendered(query, d)) for d in docs[:2]]
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert shared > 3 * BLOCK  # the system prompt, the instruction and the query
    before = server.scrape()
    r = await http.post("/rerank", json={"query": query, "documents": docs})
    assert r.status_code == 200, r.text
    after = server.scrape()
    hits = sample_sum(after, "vllm:prefix_cache_hits_total") - sample_sum(before,
                                                                 "vllm:prefix_cache_hits_total")
    # every document after the first finds the shared prefix's full blocks cached
    assert hits >= (len(docs) - 1) * (shared // BLOCK) * BLOCK
    await pod_released(server)


async def test_instruction_and_chat_template_kwargs_reach_the_template(http, server):
    async def used(**extra) -> int:
        r = await http.post("/score", json={"queries": "cats", "documents": ["a cat"], **extra})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    plain = await used()
    long = "Given a question about pets, find the passages that answer it in full detail"
    assert await used(instruction=long) == len(await tokens(http, rendered(
        "cats", "a cat", instruction=long))) != plain
    # explicit kwargs win over the top-level field (vLLM's merge)
    assert await used(instruction=long, chat_template_kwargs={"instruction": "x"}) == len(
        await tokens(http, rendered("cats", "a cat", instruction="x")))
    bad = await http.post("/score", json={"queries": "a", "documents": ["b"],
                                          "chat_template_kwargs": {"tokenize": True}})
    assert bad.status_code == 400 and "reserved keys" in bad.json()["error"]["message"]
    await pod_released(server)


async def test_score_logits_and_probabilities_agree(http):
    pairs = {"queries": "what is the capital of France?",
             "documents": ["Paris is the capital of France.", "Berlin is in Germany."]}
    probs = [d["score"] for d in (await http.post("/score", json=pairs)).json()["data"]]
    logits = [d["score"] for d in (await http.post(
        "/score", json={**pairs, "use_activation": False})).json()["data"]]
    assert probs[0] > probs[1]
    assert [1 / (1 + math.exp(-x)) for x in logits] == pytest.approx(probs, rel=1e-9)
    n_to_n = (await http.post("/score", json={"text_1": ["a b", "c d"], "text_2": ["a b",
                                                                                  "x y"]})).json()
    assert [d["index"] for d in n_to_n["data"]] == [0, 1]
    assert n_to_n["data"][0]["score"] > n_to_n["data"][1]["score"]


async def test_max_tokens_per_doc_cuts_the_document(http, server):
    doc = " ".join(f"word{i}" for i in range(200))
    full = (await http.post("/score", json={"queries": "q", "documents": [doc]})).json()
    cut = (await http.post("/score", json={"queries": "q", "documents": [doc],
                                           "max_tokens_per_doc": 10})).json()
    assert full["usage"]["prompt_tokens"] == len(await tokens(http, rendered("q", doc)))
    assert cut["usage"]["prompt_tokens"] < full["usage"]["prompt_tokens"] - 100
    await pod_released(server)


async def test_classify_answers_a_probability_per_prompt(http, server):
    r = await http.post("/classify", json={"model": REPO, "input": ["hello world", "bye"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("classify-") and body["object"] == "list"
    for i, item in enumerate(body["data"]):
        assert item["index"] == i and item["num_classes"] == 1 and item["label"] == "LABEL_0"
        assert 0 < item["probs"][0] < 1
    raw = (await http.post("/classify", json={"input": "hello world", "use_activation": False})
           ).json()["data"][0]["probs"][0]
    assert 1 / (1 + math.exp(-raw)) == pytest.approx(body["data"][0]["probs"][0], rel=1e-6)
    chat = await http.post("/classify", json={"messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200 and len(chat.json()["data"]) == 1
    pooled = (await http.post("/pooling", json={"input": "hello world"})).json()
    assert pooled["data"][0]["data"] == body["data"][0]["probs"]
    assert body["usage"]["prompt_tokens"] == sum([len(await tokens(http, t))
                                                  for t in ("hello world", "bye")])
    await pod_released(server)


@pytest.mark.parametrize("path, body, status, says", [
    ("/v1/embeddings", {"input": "x"}, 404, "Not Found"),
    ("/v2/embed", {"texts": ["x"]}, 404, "Not Found"),
    ("/v1/completions", {"prompt": "x"}, 404, "Not Found"),
    ("/v1/chat/completions", {"messages": []}, 404, "Not Found"),
    ("/pooling", {"input": "x", "task": "embed"}, 400,
     "Unsupported task: 'embed' Supported tasks: ('classify', 'token_classify')"),
    ("/classify", {"input": []}, 400, "You must pass at least one prompt"),
    ("/classify", {"input": "x", "normalize": True}, 400, "Parameter `normalize` was removed"),
    ("/score", {"queries": ["a", "b"], "documents": ["a", "b", "c"]}, 400,
     "Input lengths must be either 1:1, 1:N or N:N"),
    ("/rerank", {"query": "q", "documents": ["d"], "max_tokens_per_doc": 1024}, 400,
     "max_tokens_per_doc (1024) must be less than max_model_len (1024)."),
    ("/rerank", {"query": "q", "documents": ["word " * 1100]}, 400,
     "maximum context length is 1024 tokens"),
])
async def test_what_a_cross_encoder_pod_refuses(http, server, path, body, status, says):
    r = await http.post(path, json=body)
    assert r.status_code == status and says in r.json()["error"]["message"], r.text
    await pod_released(server)


async def test_sagemaker_invocations_take_a_classifiers_bodies(http):
    cls = await http.post("/invocations", json={"input": "hello world"})
    assert cls.status_code == 200 and cls.json()["data"][0]["num_classes"] == 1
    rr = await http.post("/invocations", json={"query": "cat", "documents": ["cat", "dog"]})
    assert rr.status_code == 200 and rr.json()["results"][0]["index"] == 0
    no = await http.post("/invocations", json={"prompt": "hi", "max_tokens": 2})
    assert no.status_code == 400 and "Expected one of: ['ClassificationRequest', " \
        "'RerankRequest', 'ScoreRequest', 'PoolingRequest']" in no.text


async def test_grpc_embed_on_a_classifier_is_invalid(server):
    import grpc
    from smg_grpc_proto import vllm_engine_pb2 as vpb
    from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc

    async with grpc.aio.insecure_channel(server.target) as channel:
        stub = vpb_grpc.VllmEngineStub(channel)
        assert (await stub.GetModelInfo(vpb.GetModelInfoRequest())).is_generation is False
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Embed(vpb.EmbedRequest(request_id="e1", tokenized=vpb.TokenizedInput(
                original_text="hi", input_ids=[1, 2, 3])))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not support the 'embed' pooling task" in refused.value.details()
    await pod_released(server)


def test_aiperf_rankings_run_one_prompt_per_pair(server, tmp_path):
    n, passages = 12, 4
    before = sample_sum(server.scrape(), "vllm:request_success_total")
    aiperf_rankings(server, REPO, tmp_path, n, passages)
    # a cross-encoder pools each (query, passage) pair: 4 prompts per call, not 5
    assert sample_sum(server.scrape(), "vllm:request_success_total") - before == n * passages
