"""vLLM's `--enable-force-include-usage` on a real pod (`doppelchip vllm serve`, which passes
it to `serve`): every streamed completions and chat answer carries its usage so far on each
chunk and the whole usage in a last chunk, though the request asked for none — what a gateway
that bills by tokens relies on."""

from __future__ import annotations

import httpx
import pytest
from http_helpers import stream_events
from server_proc import ServerProcess

REPO = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, REPO, "--max-model-len", "4k", "--enable-force-include-usage",
                       "--time-scale", "0.01", vllm=True) as server:
        yield server


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
async def test_every_stream_carries_its_usage_unasked(pod, route):
    body = {"model": REPO, "max_tokens": 5, "ignore_eos": True, "stream": True,
            **({"prompt": "count with me"} if route == "/v1/completions" else
               {"messages": [{"role": "user", "content": "count with me"}]})}
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=60) as http:
        _, events = await stream_events(http, route, body)
    chunks = [e for e in events if isinstance(e, dict) and e.get("choices")]
    assert chunks and all("usage" in e for e in chunks)
    last = [e for e in events if isinstance(e, dict) and e.get("choices") == []]
    assert len(last) == 1 and last[0]["usage"]["completion_tokens"] == 5
    assert last[0]["usage"]["total_tokens"] == last[0]["usage"]["prompt_tokens"] + 5
    assert chunks[-1]["usage"]["completion_tokens"] == 5
