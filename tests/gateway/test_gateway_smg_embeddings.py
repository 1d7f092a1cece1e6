"""Embeddings through the real smg gateway: two doppelchip replicas of an embedding model
(`VllmEngine.Embed`, `GetModelInfo.is_generation` false) behind smg, which tokenizes the
input itself and sends each replica token ids. The `openai` client gets vLLM-shaped vectors
through it, the same vectors a replica's own `/v1/embeddings` gives for those tokens, and the
requests are spread over both replicas and released."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import openai
import pytest
from fleets import assert_released
from gateway_harness import SMG, Gateway, gateway, gateway_fleet

from clients.client import AsyncClient

pytestmark = pytest.mark.skipif(SMG is None, reason="smg is not installed (make install-dev)")

EMBED = {"name": "embed", "model": "qwen3-embedding-0.6b", "quant": "bf16", "chip": "h100-sxm",
         "engine": "vllm", "max_model_len": 512}
# an encoder (XLM-RoBERTa: no KV cache, one null block): the same path, the same answers
ENCODER = {**EMBED, "model": "bge-m3", "quant": "f16"}


@pytest.fixture(params=[EMBED, ENCODER], ids=["decoder", "encoder"])
async def two_replicas(tmp_path, request) -> AsyncIterator[Gateway]:
    fleet = gateway_fleet([request.param])
    async with gateway(tmp_path, [fleet, fleet]) as gw:
        yield gw


def served(text: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{") and 'reason="stop"' in line)


async def test_embeddings_through_smg(two_replicas):
    gw = two_replicas
    texts = ["the cat sat on the mat", "the cat sat on a mat", "quarterly revenue fell"]
    async with openai.AsyncOpenAI(base_url=f"{gw.base}/v1", api_key="none", max_retries=0,
                                  timeout=30) as oai:
        v = []
        for text in texts:  # (smg's gRPC embeddings take one input per request)
            r = await oai.embeddings.create(model=gw.model, input=text, encoding_format="float")
            assert len(r.data) == 1 and len(r.data[0].embedding) == 1024, gw.log_tail()
            assert r.usage.prompt_tokens > 0
            v.append(np.asarray(r.data[0].embedding))
        assert all(abs(np.linalg.norm(x) - 1) < 1e-5 for x in v)
        assert v[0] @ v[1] > 0.6 > v[0] @ v[2]
    per_replica = [served(rep.scrape()) for rep in gw.replicas]
    assert per_replica in ([2, 1], [1, 2])  # round robin over both
    # the vector a replica's own route gives for the same text (smg tokenized it with the
    # tokenizer the replica sent it; the vector leaves special tokens out)
    async with openai.AsyncOpenAI(base_url=f"{gw.replicas[1].http_url}/v1", api_key="none",
                                  max_retries=0, timeout=30) as own:
        mine = await own.embeddings.create(model="x", input=texts[0], encoding_format="float")
    assert np.allclose(mine.data[0].embedding, v[0], atol=1e-6)
    for rep in gw.replicas:
        async with AsyncClient(rep.target) as client:
            await assert_released(client, "embed")
