"""vLLM's `--per-request-spec-decode-metrics` (server/engine/spec_metrics.py): an answer to one
prompt with n = 1 from a speculating pod carries `metrics.speculative_decoding`, its own
acceptance tally. The engine counts it where the pod's `vllm:spec_decode_*` counters count,
so the requests' tallies add up to the counters' increase; `detailed` adds each verification
step in order; a stream carries it on its usage chunk without None fields; completions, chat
and `/inference/v1/generate` carry it, a Responses answer does not (as vLLM 0.34.0); without
speculative decoding the flag is vLLM's start-up error. Over gRPC, VllmEngine's `complete`
message carries the accepted and drafted counts (smg-grpc-servicer's `spec_accepted_tokens`,
`spec_draft_tokens`)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter

import grpc
import pytest
from fleets import TEST_FLEET, fleet_doc
from http_helpers import http_client, stream_events
from server_proc import ServerProcess, metric
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc

from server.config import ConfigError, parse_fleet

SPEC = json.dumps({"method": "eagle3", "num_speculative_tokens": 3, "acceptance_rate": 0.6})
BASE = {**TEST_FLEET["deployments"][0], "speculative_config": SPEC}
DETAILED = {**BASE, "name": "detailed", "served_model_name": ["detailed"],
            "per_request_spec_decode_metrics": "detailed"}
SUMMARY = {**BASE, "name": "summary", "served_model_name": ["summary"],
           "per_request_spec_decode_metrics": "summary"}
KEYS = {"mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram",
        "num_spec_steps", "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_tokens"}
TIMINGS = {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
           "tokens_per_second"}


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(fleet_doc(deployments=[DETAILED, SUMMARY]), "--enable-scale-out") as s:
        yield s


def body(model: str, tokens: int, seed: int, **extra) -> dict:
    prompt = [(13 * i + seed) % 3000 + 200 for i in range(40)]
    return {"model": model, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True,
            "seed": seed, **extra}


def counters(text: str, name: str) -> tuple[float, float, float]:
    """The deployment's vllm:spec_decode_* counters: drafts (verification steps), drafted
    tokens, accepted tokens."""
    return tuple(metric(text, f"vllm:spec_decode_num_{kind}_total", deployment=name)
                 for kind in ("drafts", "draft_tokens", "accepted_tokens"))


def consistent(spec: dict) -> None:
    """vLLM's derived fields follow from the histogram and the drafted total."""
    steps, accepted = spec["num_spec_steps"], spec["num_accepted_draft_tokens"]
    assert len(spec["acceptance_histogram"]) == spec["num_spec_tokens"] + 1 == 4
    assert sum(spec["acceptance_histogram"]) == steps > 0
    assert sum(j * c for j, c in enumerate(spec["acceptance_histogram"])) == accepted
    assert spec["mean_acceptance_length"] == pytest.approx(1 + accepted / steps)
    assert spec["draft_acceptance_rate"] == pytest.approx(accepted / spec["num_draft_tokens"])


async def test_the_requests_tallies_add_up_to_the_pods_counters(pod):
    before = counters(pod.scrape(), "detailed")
    async with http_client(pod) as http:
        answers = await asyncio.gather(*(http.post("/v1/completions",
                                                   json=body("detailed", 30 + 7 * i, i))
                                         for i in range(4)))
    after = counters(pod.scrape(), "detailed")
    specs = [a.json()["metrics"]["speculative_decoding"] for a in answers]
    for a, spec in zip(answers, specs, strict=True):
        consistent(spec)
        # every verification step yields its accepted drafts and one token of its own; the
        # first token comes from the prefill; the last step may run past max_tokens
        tokens = a.json()["usage"]["completion_tokens"]
        assert spec["num_spec_steps"] < tokens <= 1 + spec["num_spec_steps"] + \
            spec["num_accepted_draft_tokens"]
        # detailed: each step in order, the same counts as the histogram
        assert len(spec["per_step_accepted"]) == spec["num_spec_steps"]
        assert Counter(spec["per_step_accepted"]) == {
            j: c for j, c in enumerate(spec["acceptance_histogram"]) if c}
        assert sum(spec["per_step_drafted"]) == spec["num_draft_tokens"]
        # without --enable-per-request-metrics the timings are null (the answer's model_dump)
        assert {k for k, v in a.json()["metrics"].items() if v is None} == TIMINGS
    drafts, drafted, accepted = (b - a for a, b in zip(before, after, strict=True))
    assert sum(s["num_spec_steps"] for s in specs) == drafts
    assert sum(s["num_draft_tokens"] for s in specs) == drafted
    assert sum(s["num_accepted_draft_tokens"] for s in specs) == accepted
    assert 0 < accepted < drafted  # a 0.6 acceptance rate: some drafts rejected


async def test_summary_has_no_steps_and_a_stream_carries_it_on_its_usage_chunk(pod):
    async with http_client(pod) as http:
        whole = (await http.post("/v1/completions", json=body("summary", 40, 1))).json()
        _, events = await stream_events(http, "/v1/completions", body(
            "summary", 40, 1, stream=True, stream_options={"include_usage": True}))
        _, chat = await stream_events(http, "/v1/chat/completions", {
            "model": "summary", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 20, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}})
    spec = whole["metrics"]["speculative_decoding"]
    consistent(spec)
    assert spec["per_step_accepted"] is None and spec["per_step_drafted"] is None
    last = [e for e in events if isinstance(e, dict)][-1]
    assert last["choices"] == []
    # exclude_none: no null timings, no null per-step lists; the same request's tally
    assert last["metrics"] == {"speculative_decoding": {k: spec[k] for k in KEYS}}
    chat_last = [e for e in chat if isinstance(e, dict)][-1]
    assert set(chat_last["metrics"]["speculative_decoding"]) == KEYS


async def test_chat_and_generate_carry_it_responses_and_several_choices_do_not(pod):
    async with http_client(pod) as http:
        chat = await http.post("/v1/chat/completions", json={
            "model": "detailed", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 12, "ignore_eos": True})
        gen = await http.post("/inference/v1/generate", json={
            "model": "detailed", "token_ids": [5, 6, 7, 8],
            "sampling_params": {"max_tokens": 12, "ignore_eos": True}})
        resp = await http.post("/v1/responses", json={"model": "detailed", "input": "Hi",
                                                      "max_output_tokens": 12})
        n2 = await http.post("/v1/completions", json=body("detailed", 12, 2, n=2))
    consistent(chat.json()["metrics"]["speculative_decoding"])
    consistent(gen.json()["metrics"]["speculative_decoding"])
    assert resp.status_code == 200 and "metrics" not in resp.json()
    assert n2.json()["metrics"] is None


async def test_the_vllm_engine_complete_message_carries_the_counts(pod):
    """The pod's VllmEngine fronts its default deployment, `detailed`."""
    before = counters(pod.scrape(), "detailed")
    async with grpc.aio.insecure_channel(pod.target) as channel:
        stub = vpb_grpc.VllmEngineStub(channel)
        req = vpb.GenerateRequest(
            request_id="spec-1", tokenized=vpb.TokenizedInput(input_ids=list(range(300, 340))),
            sampling_params=vpb.SamplingParams(max_tokens=40, ignore_eos=True), stream=False)
        done = [r async for r in stub.Generate(req)][-1].complete
    drafts, drafted, accepted = (b - a for a, b in zip(before, counters(pod.scrape(),
                                                                        "detailed"),
                                                       strict=True))
    assert done.completion_tokens == 40 and drafts > 0
    assert (done.spec_accepted_tokens, done.spec_draft_tokens) == (accepted, drafted)
    assert 0 < done.spec_accepted_tokens < done.spec_draft_tokens


async def test_a_pod_without_the_flag_sends_none(server):
    # the test fleet's pods do not speculate: no block, metrics null as before
    async with http_client(server) as http:
        r = await http.post("/v1/completions", json=body("llama-3.1-8b", 4, 0))
    assert r.json()["metrics"] is None


def test_without_speculative_decoding_it_is_vllms_start_up_error():
    words = ("--per-request-spec-decode-metrics requires speculative decoding to be enabled "
             "(via --speculative-config).")
    plain = {**TEST_FLEET["deployments"][0], "per_request_spec_decode_metrics": "summary"}
    with pytest.raises(ConfigError, match="requires speculative decoding"):
        parse_fleet(fleet_doc(deployments=[plain]))
    with pytest.raises(ConfigError, match="must be one of none, summary, detailed"):
        parse_fleet(fleet_doc(deployments=[{**DETAILED, "per_request_spec_decode_metrics":
                                            "all"}]))
    cmd = [sys.executable, "-m", "doppelchip.cli", "vllm", "serve", "meta-llama/Llama-3.1-8B",
           "--port", "0", "--per-request-spec-decode-metrics", "summary"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and words in done.stderr
    # a fleet sets it per deployment, in the file: on serve's command line it needs pod mode
    fleet = subprocess.run([sys.executable, "-m", "doppelchip.cli", "serve", "--port", "0",
                            "--http-port", "0", "--per-request-spec-decode-metrics", "summary"],
                           capture_output=True, text=True, timeout=60)
    assert fleet.returncode == 2 and "needs pod mode" in fleet.stderr
