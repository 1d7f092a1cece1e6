"""vLLM's front-end flags on a real pod (`doppelchip vllm serve`, which passes them to
`serve`): with `--enable-force-include-usage` every streamed completions and chat answer
carries its usage so far on each chunk and the whole usage in a last chunk, though the request
asked for none — what a gateway that bills by tokens relies on; `--max-logprobs` moves the
cap on (prompt) logprobs from vLLM's default 20, with vLLM's 400 past it."""

from __future__ import annotations

import httpx
import pytest
from http_helpers import stream_events
from server_proc import ServerProcess

REPO = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, REPO, "--max-model-len", "4k", "--enable-force-include-usage",
                       "--max-logprobs", "30", "--time-scale", "0.01", vllm=True) as server:
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


async def test_max_logprobs_moves_the_cap(pod):
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=60) as http:
        ok = await http.post("/v1/completions", json={
            "model": REPO, "prompt": "hi", "max_tokens": 2, "logprobs": 25, "prompt_logprobs": 30})
        assert ok.status_code == 200, ok.text
        choice = ok.json()["choices"][0]
        assert all(len(top) == 25 for top in choice["logprobs"]["top_logprobs"])
        too_many = await http.post("/v1/chat/completions", json={
            "model": REPO, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "logprobs": True, "top_logprobs": 31})
        assert too_many.status_code == 400
        error = too_many.json()["error"]
        assert (error["message"], error["param"]) == (
            "Requested sample logprobs of 31, which is greater than max allowed: 30 "
            "(parameter=logprobs, value=31)", "logprobs")
