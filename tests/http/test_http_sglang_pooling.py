"""An SGLang pod of a cross-encoder (bge-reranker-v2-m3): SGLang's `/v1/rerank` answers a list,
best first, with the same scores a vLLM pod of the model gives for the same pairs; `top_n`,
`return_documents` and SGLang's refusals; `/encode` pools prompts; the generation routes are
not mounted; `/health` runs a pooling request; every request is released."""

from __future__ import annotations

import pytest
from http_helpers import http_client, pod_released
from server_proc import ServerProcess

MODEL = ("--chip", "h100-sxm", "--model", "bge-reranker-v2-m3", "--quant", "f16",
         "--time-scale", "0.05")
QUERY = "what is a panda?"
DOCS = ["hi", "The giant panda is a bear native to China.", "pandas is a Python library",
        "Bamboo is most of a panda's diet."]


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *MODEL, "--engine", "sglang", "--http-api", "sglang") as s:
        yield s


@pytest.fixture
async def h(pod):
    async with http_client(pod) as c:
        yield c


async def test_rerank_answers_sglangs_list_with_vllms_scores(h, pod):
    r = await h.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
    assert r.status_code == 200
    results = r.json()
    assert sorted(x["index"] for x in results) == [0, 1, 2, 3]
    assert [x["score"] for x in results] == sorted((x["score"] for x in results), reverse=True)
    assert all(x["document"] == DOCS[x["index"]] for x in results)
    with ServerProcess(None, *MODEL, "--engine", "vllm") as vllm:  # the same model, vLLM's API
        async with http_client(vllm) as v:
            theirs = (await v.post("/rerank", json={"query": QUERY, "documents": DOCS})).json()
    by_index = {x["index"]: x["relevance_score"] for x in theirs["results"]}
    assert {x["index"]: x["score"] for x in results} == pytest.approx(by_index, rel=1e-9)
    top = (await h.post("/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 2,
                                            "return_documents": False})).json()
    assert top == [{"score": x["score"], "index": x["index"]} for x in results[:2]]
    await pod_released(pod)


@pytest.mark.parametrize(("body", "message"), [
    ({"query": "", "documents": ["a"]}, "Query cannot be empty"),
    ({"query": "  ", "documents": ["a"]}, "Query cannot be empty or whitespace only"),
    ({"query": "q", "documents": []}, "Documents cannot be empty"),
    ({"query": "q", "documents": ["a", ""]}, "Each document must be a non-empty string"),
    ({"query": "q", "documents": ["a"], "top_n": 0},
     "Value error, parameter top_n should be larger than 0."),
])
async def test_rerank_refusals(h, pod, body, message):
    r = await h.post("/v1/rerank", json=body)
    assert r.status_code == 400
    assert r.json() == {"object": "error", "message": message, "type": "BadRequestError",
                        "param": None, "code": 400}
    await pod_released(pod)


async def test_encode_and_routes(h, pod):
    one = (await h.post("/encode", json={"text": "hello", "rid": "e"})).json()
    assert one["meta_info"]["id"] == "e" and one["meta_info"]["prompt_tokens"] > 0
    assert len(one["embedding"]) == 1  # a cross-encoder's one label
    both = (await h.post("/encode", json={"text": ["a", "b c"]})).json()
    assert len(both) == 2
    assert (await h.post("/encode", json={})).json() == {
        "error": {"message": "Either text or input_ids should be provided."}}
    assert (await h.post("/generate", json={"text": "hi"})).status_code == 404
    assert (await h.post("/v1/completions", json={"prompt": "hi"})).status_code == 404
    assert (await h.get("/model_info")).json()["is_generation"] is False
    assert (await h.get("/health")).status_code == 200  # a pooling request, as SGLang's
    await pod_released(pod)
