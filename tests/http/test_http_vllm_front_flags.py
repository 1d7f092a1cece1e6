"""vLLM's front-end flags on a real pod (`doppelchip vllm serve`, which passes them to
`serve`): with `--enable-force-include-usage` every streamed completions and chat answer
carries its usage so far on each chunk and the whole usage in a last chunk, though the request
asked for none — what a gateway that bills by tokens relies on; `--max-logprobs` moves the
cap on (prompt) logprobs from vLLM's default 20, with vLLM's 400 past it; with
`--disable-log-stats` vLLM builds no stat loggers, so /metrics carries none of the engine's
vllm: series, while doppelchip's own and the HTTP series stay; `--response-role` names the
role of a chat answer to a generation prompt, and `--return-tokens-as-token-ids` makes
logprobs name tokens `token_id:N` unless a request says otherwise."""

from __future__ import annotations

import httpx
import pytest
from http_helpers import stream_events
from server_proc import ServerProcess

REPO = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, REPO, "--max-model-len", "4k", "--enable-force-include-usage",
                       "--max-logprobs", "30", "--disable-log-stats", "--response-role", "bot",
                       "--return-tokens-as-token-ids", "--time-scale", "0.01",
                       vllm=True) as server:
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


async def test_without_log_stats_metrics_has_no_vllm_series(pod):
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=60) as http:
        r = await http.post("/v1/completions", json={"model": REPO, "prompt": "hi",
                                                     "max_tokens": 3})
        assert r.status_code == 200
        text = (await http.get("/metrics")).text
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
             if line and not line.startswith("#")}
    # the engine's and the requests' go; the API server's own render time stays, as in vLLM
    # 0.34.0 (it is not a stat logger's)
    assert {n for n in names if n.startswith("vllm:")} == {
        f"vllm:request_render_duration_seconds_{s}" for s in ("bucket", "count", "sum")}
    assert "doppelchip_busy_seconds_total" in names and "http_requests_total" in names


async def test_the_response_role_is_the_servers_for_a_generation_prompt(pod):
    body = {"model": REPO, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=60) as http:
        answer = (await http.post("/v1/chat/completions", json=body)).json()
        _, events = await stream_events(http, "/v1/chat/completions", {**body, "stream": True})
        continued = (await http.post("/v1/chat/completions", json={
            **body, "add_generation_prompt": False, "continue_final_message": True})).json()
    assert answer["choices"][0]["message"]["role"] == "bot"
    first = next(e for e in events if isinstance(e, dict) and e.get("choices"))
    assert first["choices"][0]["delta"]["role"] == "bot"
    assert continued["choices"][0]["message"]["role"] == "user"  # its last message's


async def test_logprobs_name_token_ids_unless_the_request_says_otherwise(pod):
    body = {"model": REPO, "prompt": "hi", "max_tokens": 3, "logprobs": 1,
            "return_token_ids": True}
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=60) as http:
        ids = (await http.post("/v1/completions", json=body)).json()["choices"][0]
        text = (await http.post("/v1/completions", json={
            **body, "return_tokens_as_token_ids": False})).json()["choices"][0]
    assert ids["logprobs"]["tokens"] == [f"token_id:{t}" for t in ids["token_ids"]]
    assert "".join(text["logprobs"]["tokens"]) == text["text"]
