"""The engine's per-request speculative-decoding tally (server/engine/spec_metrics.py, vLLM's
`RequestSpecDecodeMetrics`): each verification step of a request is counted on that request,
across preemptions, so the requests' tallies add up to the core's `vllm:spec_decode_*`
counters; `summary` keeps no steps; `none` keeps nothing; the derived fields are vLLM's."""

from __future__ import annotations

import json

import pytest

from server.engine.build import build_core
from server.engine.options import EngineOptions
from server.engine.request import Request, SamplingParams
from server.engine.spec_metrics import RequestSpecDecodeMetrics

SPEC = json.dumps({"method": "eagle3", "num_speculative_tokens": 3, "acceptance_rate": 0.6})
# a 512-token KV pool for eight 40-token prompts writing up to 90 tokens each: preemptions
BASE = dict(name="x", model="llama-3.1-8b", quant="bf16", chip="h100-sxm", engine="vllm",
            kv_blocks=32, block_size=16, max_model_len=512, speculative_config=SPEC)


def run(level: str) -> tuple[list[Request], object]:
    core = build_core(EngineOptions(**BASE, per_request_spec_decode_metrics=level))
    reqs = [Request(f"r{i}", [16 + (7 * i + j) % 500 for j in range(40)],
                    SamplingParams(max_tokens=50 + 5 * i, seed=i, ignore_eos=True))
            for i in range(8)]
    for r in reqs:
        core.add_request(r)
    while core.has_unfinished():
        assert core.step() is not None
        core.scheduler.check_integrity()
    return reqs, core


def test_the_tallies_add_up_to_the_core_counters_across_preemptions():
    reqs, core = run("detailed")
    st = core.stats
    assert sum(r.num_preemptions for r in reqs) > 0  # the small pool preempted some
    tallies = [r.spec_decode_metrics for r in reqs]
    assert all(t is not None for t in tallies)
    assert sum(sum(t.histogram) for t in tallies) == st.spec_num_drafts
    assert sum(t.num_draft_tokens for t in tallies) == st.spec_num_draft_tokens
    assert sum(t.num_accepted_draft_tokens for t in tallies) == st.spec_num_accepted_tokens
    for t in tallies:
        assert len(t.per_step_accepted) == len(t.per_step_drafted) == sum(t.histogram)
        assert all(a <= d for a, d in zip(t.per_step_accepted, t.per_step_drafted, strict=True))


def test_summary_keeps_no_steps_and_none_keeps_nothing():
    summary, _ = run("summary")
    assert all(r.spec_decode_metrics.histogram and not r.spec_decode_metrics.per_step_accepted
               for r in summary)
    detailed, _ = run("detailed")
    # the same draws: the level changes what is kept, not what happens
    assert [r.spec_decode_metrics.histogram for r in summary] == \
        [r.spec_decode_metrics.histogram for r in detailed]
    off, _ = run("none")
    assert all(r.spec_decode_metrics is None for r in off)


def test_the_derived_fields_are_vllms():
    t = RequestSpecDecodeMetrics.new(3)
    for drafted, accepted in ((3, 0), (3, 2), (3, 2), (2, 1)):
        t.observe(drafted, accepted, detailed=False)
    d = t.to_dict()
    assert d["acceptance_histogram"] == [1, 1, 2, 0]
    assert (d["num_spec_steps"], d["num_accepted_draft_tokens"], d["num_draft_tokens"]) == \
        (4, 5, 11)
    assert d["mean_acceptance_length"] == pytest.approx(1 + 5 / 4)  # the bonus token counted
    assert d["draft_acceptance_rate"] == pytest.approx(5 / 11)  # drafts only
    assert d["per_step_accepted"] is None
    empty = RequestSpecDecodeMetrics.new(3).to_dict()  # a request that never verified
    assert (empty["mean_acceptance_length"], empty["draft_acceptance_rate"]) == (1.0, 0.0)
