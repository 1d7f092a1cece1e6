"""vLLM's `cache_salt` through the official client on a vLLM pod: the completions and chat
routes pass it to the engine, whose prefix cache shares blocks only under the same salt, so
`usage.prompt_tokens_details.cached_tokens` shows a hit for a repeated salt and none for
another salt or none (vLLM's multi-tenant isolation, which a timing side channel must not
cross). Every request is released."""

from __future__ import annotations

import pytest
from http_helpers import openai_client, pod_released
from server_proc import ServerProcess

# 16-token blocks pinned (vLLM 0.34.0's default on this chip is 64): a repeated 100-token
# prompt finds its 6 whole blocks, 96 tokens, cached
POD = ("--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b", "--quant", "bf16",
       "--max-model-len", "512", "--block-size", "16", "--time-scale", "0.05")


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *POD) as s:
        yield s


async def test_prefix_hits_stay_within_a_salt(pod):
    async with openai_client(pod) as client:
        async def completion(salt: str | None) -> int:
            extra = {"cache_salt": salt} if salt else {}
            done = await client.completions.create(
                model="llama-3.1-8b", prompt=list(range(1000, 1100)), max_tokens=1,
                extra_body=extra)
            return done.usage.prompt_tokens_details.cached_tokens

        async def chat(salt: str | None) -> int:
            extra = {"cache_salt": salt} if salt else {}
            done = await client.chat.completions.create(
                model="llama-3.1-8b", messages=[{"role": "user", "content": "hello " * 60}],
                max_tokens=1, extra_body=extra)
            return done.usage.prompt_tokens_details.cached_tokens

        assert [await completion(s) for s in ("a", "a", "b", None)] == [0, 96, 0, 0]
        assert await completion(None) == 96  # the unsalted prompt is its own namespace
        hits = [await chat(s) for s in ("a", "a", "b", None)]
        assert hits[0] == 0 and hits[1] > 0 and hits[2:] == [0, 0]
    await pod_released(pod)
