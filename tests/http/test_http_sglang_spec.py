"""Speculative decoding on an SGLang pod (`sglang serve --speculative-algorithm EAGLE3 ...`,
doppelchip/sglang_spec.py), with SGLang's default for Llama: a tree of 5 draft steps, topk 4,
8 draft tokens. The pod speculates with the acceptance SGLang's own simulation knob asks for
(`SGLANG_SIMULATE_ACC_LEN`: every verification accepts ⌊L⌋ or ⌊L⌋ + 1 tokens), `/generate`'s
final meta_info carries SGLang's `spec_*` counts of the request's verification steps, the
scheduler service's `complete` carries the accepted and proposed drafts, SGLang's `sglang:spec_*`
series count and average the same steps, the OpenAI answers carry no vLLM
`speculative_decoding` block, and running requests are capped at SGLang's 48."""

from __future__ import annotations

import asyncio
import os
from unittest import mock

import grpc
import pytest
from http_helpers import http_client, sse_events
from server_proc import ServerProcess, metric
from smg_grpc_proto import sglang_scheduler_pb2 as spb
from smg_grpc_proto import sglang_scheduler_pb2_grpc as spb_grpc

from doppelchip.cli import build_parser
from doppelchip.cmd_sglang import translate
from doppelchip.sglang_argv import sglang_argv

REPO = "meta-llama/Llama-3.1-8B-Instruct"

ACC_LEN = 2.2  # SGLang's simulated acceptance length: tokens per verification, bonus included
STEPS, TOPK, DRAFT_TOKENS = 5, 4, 8  # SGLang's choice for LlamaForCausalLM
WIDTH = DRAFT_TOKENS - 1  # the drafts each verification checks (SGLang's proposed drafts)
# real time (--time-scale 1): a stream's steps reach the client apart, as separate events
LAUNCH = ("--model-path", REPO, "--speculative-algorithm", "EAGLE3",
          "--speculative-draft-model-path", "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B",
          "--port", "0", "--grpc-port", "0", "--context-length", "1024", "--time-scale", "1",
          "--enable-metrics")


@pytest.fixture(scope="module")
def pod():
    with mock.patch.dict(os.environ, {"SGLANG_SIMULATE_ACC_LEN": str(ACC_LEN)}):
        args = build_parser("sglang").parse_args(sglang_argv(["sglang", "serve", *LAUNCH]))
        argv, _ = translate(args)
    with ServerProcess(None, *argv) as s:
        yield s


def prompt(seed: int) -> list[int]:
    return [(17 * i + seed) % 3000 + 200 for i in range(30)]


def check(meta: dict) -> None:
    """SGLang's formulas over one request's counts."""
    steps, correct = meta["spec_verify_ct"], meta["spec_num_correct_drafts"]
    hist = meta["spec_correct_drafts_histogram"]
    assert steps > 0 and meta["spec_num_proposed_drafts"] == WIDTH * steps
    assert sum(hist) == steps and sum(j * c for j, c in enumerate(hist)) == correct
    # 1 or 2 drafts a step (2.2 tokens: ⌊L⌋ or ⌊L⌋ + 1), as long as its last non-zero count
    assert len(hist) == 3 and hist[-1] > 0 and hist[0] == 0
    assert meta["spec_accept_rate"] == pytest.approx(correct / (WIDTH * steps))
    assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / steps)
    # each step yields its accepted drafts and one token of its own, after the prefill's
    assert steps < meta["completion_tokens"] <= 1 + steps + correct


def series(pod) -> tuple[float, float, float]:
    """The pod's sglang:spec_verify_calls_total, spec_accept_length and spec_accept_rate."""
    text = pod.scrape()
    return tuple(metric(text, name) for name in (
        "sglang:spec_verify_calls_total", "sglang:spec_accept_length",
        "sglang:spec_accept_rate"))


async def test_generate_reports_sglangs_counts_at_the_acceptance_asked_for(pod):
    calls = series(pod)[0]  # (a render: the gauges' window starts here)
    async with http_client(pod) as http:
        # a poll: its acceptance window starts here; the tokens per step so far, times the
        # steps so far (the verification calls of the requests finished before), is their tokens
        (first,) = (await http.get("/v1/loads")).json()["loads"]
        tokens_before = first["speculative"]["accept_length"] * calls \
            if "speculative" in first else 0.0
        answers = await asyncio.gather(*(http.post("/generate", json={
            "input_ids": prompt(i), "sampling_params": {"max_new_tokens": 80,
                                                        "ignore_eos": True}})
            for i in range(8)))
        info = (await http.get("/server_info")).json()
        (load,) = (await http.get("/v1/loads")).json()["loads"]
        (core,) = (await http.get("/v1/loads", params={"include": "core"})).json()["loads"]
    metas = [a.json()["meta_info"] for a in answers]
    for meta in metas:
        check(meta)
    # each verification step accepted 2 or 3 tokens (drafts + the bonus), so the mean is
    # between; which steps got 3 depends on how the 8 requests were batched
    steps = sum(m["spec_verify_ct"] for m in metas)
    mean = 1 + sum(m["spec_num_correct_drafts"] for m in metas) / steps
    assert 2 < mean < 3
    # the metrics SGLang's collectors export: verification calls counted at each finish, the
    # gauges over the window since the last render (these 8 requests)
    after, length, rate = series(pod)
    window_rate = (sum(m["spec_num_correct_drafts"] for m in metas)
                   / sum(m["spec_num_proposed_drafts"] for m in metas))
    assert after - calls == steps
    assert length == pytest.approx(mean, rel=1e-12)
    assert rate == pytest.approx(window_rate, rel=1e-12)
    # /v1/loads' speculative section: the rate over the poll window, the length since start
    assert load["speculative"]["accept_rate"] == pytest.approx(window_rate, rel=1e-12)
    tokens = tokens_before + steps + sum(m["spec_num_correct_drafts"] for m in metas)
    assert load["speculative"]["accept_length"] == pytest.approx(tokens / (calls + steps),
                                                                 rel=1e-9)
    assert "speculative" not in core
    assert info["max_running_requests"] == 48  # SGLang's cap under speculative decoding
    # SGLang's resolved server arguments, and the rank's mean accepted length since it started
    assert {k: info[k] for k in info if k.startswith("speculative_")} == {
        "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": LAUNCH[5],
        "speculative_draft_model_revision": "main", "speculative_num_steps": STEPS,
        "speculative_eagle_topk": TOPK, "speculative_num_draft_tokens": DRAFT_TOKENS}
    assert info["internal_states"][0]["avg_spec_accept_length"] == \
        load["speculative"]["accept_length"]


async def test_only_the_final_event_of_a_stream_carries_them(pod):
    async with http_client(pod) as http:
        async with http.stream("POST", "/generate", json={
                "input_ids": prompt(9), "stream": True,
                "sampling_params": {"max_new_tokens": 60, "ignore_eos": True}}) as r:
            events = [e for e in sse_events([line async for line in r.aiter_lines()])
                      if isinstance(e, dict)]
        chat = await http.post("/v1/chat/completions", json={
            "model": REPO, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12,
            "ignore_eos": True})
        plain = await http.post("/v1/completions", json={
            "model": REPO, "prompt": prompt(4), "max_tokens": 12, "ignore_eos": True})
    assert len(events) > 2
    assert not any("spec_verify_ct" in e["meta_info"] for e in events[:-1])
    check(events[-1]["meta_info"])
    # an SGLang pod's OpenAI answers have no vLLM speculative_decoding block
    assert chat.status_code == 200 and chat.json().get("metrics") is None
    assert plain.status_code == 200 and plain.json().get("metrics") is None


async def test_the_scheduler_services_complete_carries_the_drafts(pod):
    async with grpc.aio.insecure_channel(pod.target) as channel:
        stub = spb_grpc.SglangSchedulerStub(channel)
        msgs = [m async for m in stub.Generate(spb.GenerateRequest(
            request_id="g-1", tokenized=spb.TokenizedInput(input_ids=prompt(3)),
            sampling_params=spb.SamplingParams(max_new_tokens=40, ignore_eos=True,
                                               temperature=1.0),
            stream=False, logprob_start_len=-1))]
        (load,) = (await stub.GetLoads(spb.GetLoadsRequest(include=["spec"]))).loads
    done = msgs[-1].complete
    assert load.HasField("speculative") and 1 < load.speculative.accept_length < 3.01
    assert 0 < load.speculative.accept_rate < 1
    assert done.completion_tokens == 40 and done.spec_draft_tokens > 0
    assert done.spec_draft_tokens % WIDTH == 0  # SGLang's: steps x drafts per step
    assert 0 < done.spec_accepted_tokens < done.spec_draft_tokens
