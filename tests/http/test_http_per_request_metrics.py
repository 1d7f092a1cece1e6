"""vLLM's `--enable-per-request-metrics` (server/http/per_request_metrics.py): a completions,
chat or Responses answer to one prompt with n = 1 carries `metrics`, its own timings on the
emulated timeline, the same ones the pod's `vllm:request_*_time_seconds` histograms record; a
stream carries them on its usage chunk (None fields left out); n > 1 gets null; without the
flag `metrics` is null (and a Responses answer has none); with `--disable-log-stats` the pod
refuses to start in vLLM's words."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from fleets import fleet_doc
from http_helpers import http_client, stream_events
from server_proc import ServerProcess, metric

MODEL = "llama-3.1-8b"
# one sequence at a time: a second request waits in the queue behind the first
POD = {"name": "pod", "model": MODEL, "quant": "bf16", "chip": "h100-sxm", "engine": "vllm",
       "max_model_len": 1024, "max_num_seqs": 1}
FIELDS = {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
          "tokens_per_second", "speculative_decoding"}
PROMPT = [(11 * i) % 3000 + 200 for i in range(300)]


@pytest.fixture(scope="module")
def pod():
    doc = fleet_doc({"time_scale": 0.2, "enable_per_request_metrics": True}, [POD])
    with ServerProcess(doc) as s:
        yield s


def sums(text: str) -> tuple[float, float, float]:
    """The pod's summed queue, prefill and decode seconds (vLLM's histograms)."""
    return tuple(metric(text, f"vllm:request_{kind}_time_seconds_sum", model_name=MODEL)
                 for kind in ("queue", "prefill", "decode"))


def completion(tokens: int, **extra) -> dict:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": tokens, "ignore_eos": True, **extra}


async def test_the_metrics_are_the_emulated_timeline_the_histograms_record(pod):
    before = sums(pod.scrape())
    async with http_client(pod) as http:
        # two at once on one seat: the second waits, so its queue time is not zero
        answers = await asyncio.gather(*(http.post("/v1/completions", json=completion(40))
                                         for _ in range(2)))
    after = sums(pod.scrape())
    metrics = [a.json()["metrics"] for a in answers]
    assert all(set(m) == FIELDS and m["speculative_decoding"] is None for m in metrics)
    queue, prefill, decode = (b - a for a, b in zip(before, after, strict=True))
    assert max(m["queue_time_ms"] for m in metrics) > 0
    # vLLM's TTFT field is first scheduled -> first token: the prefill, no queueing
    assert sum(m["queue_time_ms"] for m in metrics) == pytest.approx(queue * 1000, rel=1e-9)
    assert sum(m["time_to_first_token_ms"] for m in metrics) == pytest.approx(prefill * 1000,
                                                                                rel=1e-9)
    assert sum(m["generation_time_ms"] for m in metrics) == pytest.approx(decode * 1000,
                                                                           rel=1e-9)
    for m in metrics:
        assert m["mean_itl_ms"] == pytest.approx(m["generation_time_ms"] / 39)
        assert m["tokens_per_second"] == pytest.approx(
            40 / ((m["time_to_first_token_ms"] + m["generation_time_ms"]) / 1000))


async def test_chat_and_responses_answers_carry_them_too(pod):
    async with http_client(pod) as http:
        chat = await http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            "ignore_eos": True})
        resp = await http.post("/v1/responses", json={"model": MODEL, "input": "Hi",
                                                      "max_output_tokens": 3})
    assert set(chat.json()["metrics"]) == FIELDS
    assert chat.json()["metrics"]["generation_time_ms"] > 0
    assert set(resp.json()["metrics"]) == FIELDS


async def test_a_stream_carries_them_on_its_usage_chunk_without_none_fields(pod):
    async with http_client(pod) as http:
        r, events = await stream_events(http, "/v1/completions", completion(
            1, stream=True, stream_options={"include_usage": True}))
        assert r.status_code == 200
        last = [e for e in events if isinstance(e, dict)][-1]  # (before [DONE])
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == 1
        # one token: no inter-token latency, left out (vLLM dumps with exclude_none)
        assert set(last["metrics"]) == {"time_to_first_token_ms", "generation_time_ms",
                                        "queue_time_ms", "tokens_per_second"}
        _, plain = await stream_events(http, "/v1/completions", completion(2, stream=True))
        # no usage chunk, no metrics
        assert not any(isinstance(e, dict) and "metrics" in e for e in plain)


async def test_several_choices_or_prompts_get_none(pod):
    async with http_client(pod) as http:
        n2 = await http.post("/v1/completions", json=completion(2, n=2))
        two = await http.post("/v1/completions", json={**completion(2), "prompt": ["a", "b"]})
    assert n2.json()["metrics"] is None and two.json()["metrics"] is None


async def test_without_the_flag_metrics_is_null(server):
    async with http_client(server) as http:
        r = await http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi",
                                                     "max_tokens": 2})
        resp = await http.post("/v1/responses", json={"model": MODEL, "input": "Hi",
                                                      "max_output_tokens": 2})
    assert r.json()["metrics"] is None
    assert "metrics" not in resp.json()


def test_without_log_stats_it_is_vllms_start_up_error():
    cmd = [sys.executable, "-m", "doppelchip.cli", "serve", "--deployment", "vllm-h100",
           "--port", "0", "--http-port", "0", "--enable-per-request-metrics",
           "--disable-log-stats"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert ("--enable-per-request-metrics requires engine statistics logging; remove "
            "--disable-log-stats to enable per-request metrics.") in done.stderr
