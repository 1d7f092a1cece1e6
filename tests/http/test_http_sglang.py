"""An SGLang pod (`serve --http-api sglang --enable-metrics`): SGLang 0.5.23's native API —
`/generate` (JSON, cumulative SSE, batches, logprobs, stops), its refusals in SGLang's words
and shape, `/model_info`, `/server_info`, `/v1/loads`, `/flush_cache`, `/abort_request`, the
OpenAI routes with SGLang's flat errors, `/v1/models` owned by sglang — and its sglang:
metrics, whose counts follow the requests. Every request, however it ends, is released."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from http_helpers import TOK, http_client, pod_released, sse_events
from server_proc import ServerProcess

from server.stats.schema_sglang import SCHEDULER_SERIES

CTX = 512
POD = ("--chip", "h100-sxm", "--engine", "sglang", "--model", "llama-3.1-8b", "--quant",
       "bf16", "--max-model-len", str(CTX), "--time-scale", "0.05", "--http-api", "sglang",
       "--enable-metrics")


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *POD) as s:
        yield s


@pytest.fixture
async def h(pod):
    async with http_client(pod) as c:
        yield c


def prompt_len(text: str) -> int:
    return len(TOK.encode(text)) + 1  # BOS, as SGLang's tokenizer adds it


async def gen(h, **body) -> dict | list:
    r = await h.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def stream(h, **body) -> list:
    async with h.stream("POST", "/generate", json={**body, "stream": True}) as r:
        assert r.status_code == 200
        return sse_events([line async for line in r.aiter_lines()])


async def test_generate_answers_sglangs_shape(h, pod):
    out = await gen(h, text="Hello there", rid="r-1",
                    sampling_params={"max_new_tokens": 7, "ignore_eos": True})
    meta = out["meta_info"]
    assert len(out["output_ids"]) == 7 and out["text"] == TOK.decode(out["output_ids"])
    assert meta["id"] == "r-1"
    assert meta["finish_reason"] == {"type": "length", "length": 7}
    assert meta["prompt_tokens"] == prompt_len("Hello there")
    assert meta["completion_tokens"] == 7 and meta["weight_version"] == "default"
    assert meta["e2e_latency"] > 0 and meta["num_retractions"] == 0
    # token ids in, the same tokens out (one engine request over the same ids)
    ids = [TOK.bos_token_id, *TOK.encode("Hello there")]
    again = await gen(h, input_ids=ids, sampling_params={"max_new_tokens": 7,
                                                         "ignore_eos": True})
    assert again["output_ids"] == out["output_ids"]
    await pod_released(pod)


async def test_a_stream_carries_the_output_so_far(h, pod):
    events = await stream(h, text="Tell me more", sampling_params={"max_new_tokens": 400,
                                                                    "ignore_eos": True})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) >= 2  # the first token goes at once, the rest after it
    for before, after in itertools.pairwise(chunks):  # cumulative, not deltas
        assert after["output_ids"][:len(before["output_ids"])] == before["output_ids"]
        assert after["text"].startswith(before["text"])
        assert before["meta_info"]["finish_reason"] is None
    last = chunks[-1]
    assert len(last["output_ids"]) == 400 and last["meta_info"]["completion_tokens"] == 400
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 400}
    assert "index" not in last  # one output: no index
    await pod_released(pod)


async def test_batches_and_n_answer_lists(h, pod):
    out = await gen(h, text=["one", "two words"], rid=["a", "b"],
                    sampling_params={"max_new_tokens": 3, "ignore_eos": True})
    assert [o["meta_info"]["id"] for o in out] == ["a", "b"]
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [prompt_len("one"),
                                                             prompt_len("two words")]
    many = await gen(h, text="x", sampling_params={"max_new_tokens": 2, "n": 3,
                                                   "ignore_eos": True})
    assert len(many) == 3 and all(len(o["output_ids"]) == 2 for o in many)
    events = await stream(h, text=["p", "q"], sampling_params={"max_new_tokens": 2,
                                                               "ignore_eos": True})
    assert {e["index"] for e in events[:-1]} == {0, 1}
    await pod_released(pod)


async def test_stops_and_logprobs(h, pod):
    first = await gen(h, text="Stop test", sampling_params={"max_new_tokens": 6,
                                                            "ignore_eos": True})
    stop_id = first["output_ids"][2]
    out = await gen(h, text="Stop test", return_logprob=True, top_logprobs_num=2,
                    sampling_params={"max_new_tokens": 6, "stop_token_ids": [stop_id]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    ids = out["output_ids"]
    lps = out["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lps] == ids and all(lp <= 0 for lp, _, _ in lps)
    assert all(len(top) == 2 for top in out["meta_info"]["output_top_logprobs"])
    assert out["meta_info"]["input_token_logprobs"] == []
    below = await gen(h, text="Stop test", return_logprob=True, top_logprobs_num=-3,
                      sampling_params={"max_new_tokens": 2})  # below 1: none, as SGLang
    assert "output_top_logprobs" not in below["meta_info"]
    assert len(below["meta_info"]["output_token_logprobs"]) == 2
    await pod_released(pod)


@pytest.mark.parametrize(("body", "message"), [
    ({"text": "hi", "sampling_params": {"temperature": -1}},
     "temperature must be a non-negative finite number, got -1."),
    ({"text": "hi", "sampling_params": {"top_p": 0}}, "top_p must be in (0, 1], got 0."),
    ({"text": "hi", "sampling_params": {"top_k": 0}},
     "top_k must be -1 (disable) or at least 1, got 0."),
    ({"text": "hi", "sampling_params": {"max_new_tokens": 4, "min_new_tokens": 9}},
     "min_new_tokens must be in [0, max_new_tokens(4)], got 9."),
    ({"text": "hi", "sampling_params": {"foo": 1}},
     "SamplingParams.__init__() got an unexpected keyword argument 'foo'"),
    ({"sampling_params": {}}, "Either text or input_ids should be provided."),
    ({"input_ids": list(range(10, 10 + CTX))},
     f"The input ({CTX} tokens) is longer than the model's context length ({CTX} tokens)."),
    ({"input_ids": list(range(10, 110)), "sampling_params": {"max_new_tokens": 500}},
     f"Requested token count exceeds the model's maximum context length of {CTX} tokens. "
     "You requested a total of 600 tokens: 100 tokens from the input messages and 500 tokens "
     "for the completion. Please reduce the number of tokens in the input messages or the "
     "completion to fit within the limit."),
    ({"text": "hi", "return_logprob": True, "top_logprobs_num": "abc"},
     "top_logprobs_num must be an integer, got 'abc'"),  # (a 500 before: int() raised)
    ({"text": "hi", "return_logprob": True, "top_logprobs_num": [1, 2]},
     "per-prompt top_logprobs_num lists are not served by doppelchip: give one"),
])
async def test_refusals_in_sglangs_words(h, pod, body, message):
    r = await h.post("/generate", json=body)
    assert r.status_code == 400 and r.json() == {"error": {"message": message}}
    await pod_released(pod)


async def test_not_json_is_400(h):
    r = await h.post("/generate", content=b"{not json")
    assert r.status_code == 400 and "JSON decode error" in r.json()["error"]["message"]


async def test_info_routes(h, pod):
    info = (await h.get("/model_info")).json()
    assert info["is_generation"] is True and info["served_model_name"] == "llama-3.1-8b"
    assert (await h.get("/get_model_info")).json() == info
    server = (await h.get("/server_info")).json()
    assert server["context_length"] == CTX and server["version"] == "0.5.23"
    assert server["tp_size"] == 1 and len(server["internal_states"]) == 1
    models = (await h.get("/v1/models")).json()["data"]
    assert [(m["id"], m["owned_by"], m["max_model_len"]) for m in models] == [
        ("llama-3.1-8b", "sglang", CTX)]
    assert (await h.get("/v1/models/nope")).status_code == 404
    for path in ("/health", "/health_generate", "/ready"):
        assert (await h.get(path)).status_code == 200, path
    assert (await h.get("/version")).status_code == 404  # vLLM's, not SGLang's
    await pod_released(pod)


async def test_loads(h):
    loads = (await h.get("/v1/loads", params={"include": "core,queues"})).json()
    (load,) = loads["loads"]
    assert load["dp_rank"] == 0 and load["max_total_num_tokens"] > 0
    assert "queues" in load and "memory" not in load
    assert (await h.get("/v1/loads", params={"include": "bogus"})).status_code == 400
    text = (await h.get("/v1/loads", params={"format": "prometheus"})).text
    assert 'sglang_max_total_num_tokens{dp_rank="0"}' in text
    assert "# TYPE sglang_memory_token_capacity gauge" in text


async def test_flush_cache_empties_the_prefix_cache(h, pod):
    ids = list(range(100, 300))  # 200 tokens: whole blocks to cache
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
    await gen(h, **body)
    assert (await gen(h, **body))["meta_info"]["cached_tokens"] > 0
    r = await h.post("/flush_cache")
    assert r.status_code == 200 and r.text.startswith("Cache flushed.")
    assert (await gen(h, **body))["meta_info"]["cached_tokens"] == 0
    await pod_released(pod)


async def test_abort_request_ends_a_stream(h, pod):
    body = {"text": "long", "rid": "abort-me", "stream": True,
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
    async with h.stream("POST", "/generate", json=body) as r:
        lines = r.aiter_lines()
        async for line in lines:
            if line.startswith("data: "):
                break
        assert (await h.post("/abort_request", json={"rid": "abort-me"})).status_code == 200
        events = sse_events([line async for line in lines])
    last = events[-2]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(last["output_ids"]) < 400
    await pod_released(pod)


async def test_openai_routes_with_sglangs_errors(h, pod):
    r = await h.post("/v1/completions", json={"model": "any-name", "prompt": "hi",
                                               "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3
    r = await h.post("/v1/chat/completions", json={"model": "llama-3.1-8b", "max_tokens": 2,
                                                    "messages": [{"role": "user",
                                                                  "content": "hi"}]})
    assert r.status_code == 200
    r = await h.post("/v1/completions", json={"model": "llama-3.1-8b", "prompt": "hi",
                                               "temperature": -3})
    body = r.json()
    assert r.status_code == 400 and body["object"] == "error" and body["code"] == 400
    assert set(body) == {"object", "message", "type", "param", "code"}
    await pod_released(pod)


def samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


async def test_metrics_follow_the_requests(h, pod):
    labels = 'engine_type="unified",is_streaming="{}",model_name="llama-3.1-8b"'
    before = samples(pod.scrape())
    await asyncio.gather(*(gen(h, text="m", sampling_params={"max_new_tokens": 4,
                                                              "ignore_eos": True})
                           for _ in range(3)))
    await stream(h, text="m", sampling_params={"max_new_tokens": 5, "ignore_eos": True})
    for _ in range(2):  # SGLang's health probe generates a token, and is not counted
        assert (await h.get("/health_generate")).status_code == 200
    await pod_released(pod)
    text = pod.scrape()
    after = samples(text)

    def grew(name: str, streaming: str) -> float:
        key = f"{name}{{{labels.format(streaming)}}}"
        return after[key] - before.get(key, 0.0)

    assert grew("sglang:num_requests_total", "false") == 3
    assert grew("sglang:num_requests_total", "true") == 1
    assert grew("sglang:generation_tokens_total", "false") == 12
    assert grew("sglang:generation_tokens_total", "true") == 5
    assert grew("sglang:prompt_tokens_total", "false") == 3 * prompt_len("m")
    assert grew("sglang:time_to_first_token_seconds_count", "true") == 1
    assert grew("sglang:e2e_request_latency_seconds_count", "false") == 3
    assert grew("sglang:time_to_first_token_seconds_count", "false") == 3
    assert not any(line.startswith("vllm:") for line in text.splitlines())
    for name in SCHEDULER_SERIES:  # the scheduler's series, with its labels
        sample = name + ("_total" if SCHEDULER_SERIES[name][0] == "counter" else "")
        assert (f'{sample}{{engine_type="unified",model_name="llama-3.1-8b",'
                f'moe_ep_rank="0",pp_rank="0",tp_rank="0"}}') in after, name
    load = (await h.get("/v1/loads")).json()["loads"][0]
    assert after['sglang:max_total_num_tokens{engine_type="unified",model_name="llama-3.1-8b",'
                 'moe_ep_rank="0",pp_rank="0",tp_rank="0"}'] == load["max_total_num_tokens"]


async def test_api_key_and_no_metrics_without_the_flag():
    args = [a for a in POD if a != "--enable-metrics"]
    with ServerProcess(None, *args, "--api-key", "k") as s:
        async with http_client(s) as h:
            assert (await h.get("/health")).status_code == 200  # probes stay open
            r = await h.post("/generate", json={"text": "hi"})
            assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
            assert (await h.get("/model_info")).status_code == 401
            ok = await h.post("/generate", json={"text": "hi", "sampling_params": {
                "max_new_tokens": 1}}, headers={"Authorization": "Bearer k"})
            assert ok.status_code == 200
            assert (await h.get("/metrics")).status_code == 404  # SGLang: --enable-metrics
