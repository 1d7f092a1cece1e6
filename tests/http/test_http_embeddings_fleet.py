"""Embedding models and a cross-encoder beside generative ones, and what `--hf-overrides`
makes Matryoshka.

A pod serving both mounts both kinds of route; a request for a task its model does not have
gets vLLM's answer: 501 "The model does not support Embeddings API" (or Classification API:
vLLM's when the route
exists but the model has no such task), 400 "This model does not support generation" (its
input processor's). With several models, an unknown `model` is a 404 (a pod of one embedding
model answers any name, as vLLM's pooling routes do). `--hf-overrides
'{"matryoshka_dimensions": [...]}'` lets a request ask `dimensions`, and only those."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from fleets import fleet_doc
from server_proc import ServerProcess

EMBED = {"name": "embed", "model": "qwen3-embedding-0.6b", "quant": "bf16", "chip": "rtx-4090",
         "engine": "vllm", "max_model_len": 512}
E, G = EMBED["model"], "llama-3.1-8b"  # a fleet's deployments answer to their model ids
RERANK = {"name": "rerank", "model": "qwen3-reranker-0.6b", "quant": "bf16", "chip": "rtx-4090",
          "engine": "vllm", "max_model_len": 512, "chat_template": "{{ messages[0].content }}|"
          "{{ messages[1].content }}", "hf_overrides": '{"architectures": '
          '["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"], '
          '"is_original_qwen3_reranker": true}'}
R = RERANK["model"]
GEN = {"name": "gen", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
       "engine": "vllm", "max_model_len": 256}


@pytest.fixture(scope="module")
def mixed():
    with ServerProcess(fleet_doc(deployments=[GEN, EMBED, RERANK])) as server:
        yield server


async def test_each_model_answers_its_own_task_only(mixed):
    async with httpx.AsyncClient(base_url=mixed.http_url, timeout=60) as http:
        ok = await http.post("/v1/embeddings", json={"model": E, "input": "hi"})
        assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 1024
        gen = await http.post("/v1/completions", json={"model": G, "prompt": "hi",
                                                       "max_tokens": 2})
        assert gen.status_code == 200
        no = await http.post("/v1/embeddings", json={"model": G, "input": "hi"})
        assert no.status_code == 501
        assert no.json()["error"]["message"] == "The model does not support Embeddings API"
        assert no.json()["error"]["type"] == "NotImplementedError"
        no = await http.post("/rerank", json={"model": G, "query": "a", "documents": ["b"]})
        assert no.status_code == 501 and "Rerank (Score) API" in no.text
        no = await http.post("/v1/completions", json={"model": E, "prompt": "hi"})
        assert no.status_code == 400 and "This model does not support generation" in no.text
        unknown = await http.post("/v1/embeddings", json={"model": "nope", "input": "hi"})
        assert unknown.status_code == 404
        no = await http.post("/classify", json={"model": E, "input": "hi"})
        assert no.status_code == 501
        assert no.json()["error"]["message"] == "The model does not support Classification API"
        no = await http.post("/v1/embeddings", json={"model": R, "input": "hi"})
        assert no.status_code == 501 and "Embeddings API" in no.text
        # the same /score route: a cosine of two vectors, or one prompt per pair
        pair = {"queries": "cat", "documents": ["cat"]}
        bi = (await http.post("/score", json={"model": E, **pair})).json()
        cross = (await http.post("/score", json={"model": R, **pair})).json()
        assert bi["data"][0]["score"] == pytest.approx(1.0)
        assert bi["usage"]["prompt_tokens"] == 4  # (BOS + "cat") twice
        assert cross["usage"]["prompt_tokens"] == 4  # BOS, "cat", "|", "cat": the template's
        assert (await http.post("/classify", json={"model": R, "input": "hi"})).status_code \
            == 200
        models = (await http.get("/v1/models")).json()["data"]
        assert {m["id"] for m in models} == {G, E, R}


async def test_hf_overrides_make_a_model_matryoshka():
    argv = ("Qwen/Qwen3-Embedding-0.6B", "--hf-overrides",
            '{"matryoshka_dimensions": [64, 256, 1024]}', "--time-scale", "0.05")
    with ServerProcess(None, *argv, vllm=True) as pod:
        async with httpx.AsyncClient(base_url=pod.http_url, timeout=60) as http:
            full = (await http.post("/v1/embeddings", json={"input": "hello there"})).json()
            cut = await http.post("/v1/embeddings", json={"input": "hello there",
                                                          "dimensions": 64})
            assert cut.status_code == 200, cut.text
            v = np.asarray(cut.json()["data"][0]["embedding"])
            head = np.asarray(full["data"][0]["embedding"][:64])
            assert v.shape == (64,) and np.allclose(v, head / np.linalg.norm(head), atol=1e-6)
            bad = await http.post("/v1/embeddings", json={"input": "x", "dimensions": 65})
            assert bad.status_code == 400
            assert "only supports Matryoshka dimensions [64, 256, 1024], got 65" in bad.text
            big = await http.post("/v1/embeddings", json={"input": "x", "dimensions": 2048})
            assert big.status_code == 400 and "range [1, 1024], got 2048" in big.text


async def test_vllm_engine_embed_on_a_generative_deployment_is_refused(mixed):
    import grpc
    from smg_grpc_proto import vllm_engine_pb2 as vpb
    from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc

    async with grpc.aio.insecure_channel(mixed.target) as channel:  # it fronts "gen"
        stub = vpb_grpc.VllmEngineStub(channel)
        assert (await stub.GetModelInfo(vpb.GetModelInfoRequest())).is_generation is True
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Embed(vpb.EmbedRequest(request_id="e", tokenized=vpb.TokenizedInput(
                input_ids=[1, 2, 3])))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "This model does not support pooling" in refused.value.details()

