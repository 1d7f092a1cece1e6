"""`plan` sizes a trace's fleet from the trace's own traffic, not from `--rate` (which a trace
run ignores), and a rate shape's from its arrivals: the winner is then the cheapest fleet for
the traffic replayed, and its report states that traffic."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from clients.workloads import WorkloadSpec
from doppelchip.cli import main
from sim.plan import EOS_MEAN, shape
from sim.plan_trace import observed_shape

GRID = ["--model", "llama-2-7b", "--chips", "rtx-4090", "--engines", "vllm", "--quants", "bf16",
        "--tp", "1", "--max-replicas", "4", "--runners-up", "0", "--slo", "ttft=0.5"]


def write_trace(path, n: int, rate: float, isl: int = 256, max_tokens: int = 64) -> list[float]:
    rng = np.random.default_rng(7)
    stamps = np.cumsum(rng.exponential(1 / rate, n)).round(3).tolist()
    path.write_text("".join(json.dumps({"timestamp": 100 + t, "input_length": isl,
                                        "max_tokens": max_tokens}) + "\n" for t in stamps))
    return stamps


def plan(*argv: str) -> tuple[int, dict]:
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = main(["plan", *GRID, *argv, "--json"])
    lines = (buf.getvalue() or err.getvalue()).strip().splitlines()
    return rc, json.loads(lines[-1])


def test_the_trace_shape_is_read_off_its_requests(tmp_path):
    trace = tmp_path / "t.jsonl"
    stamps = write_trace(trace, 200, 2.0, isl=300, max_tokens=50)
    spec = WorkloadSpec(kind="trace", trace_path=str(trace), rate=50.0, isl=128, osl=128)
    work = shape(spec, EOS_MEAN)
    assert work.rate == pytest.approx(199 / (stamps[-1] - stamps[0]))
    assert (work.prompt, work.output_mean, work.output_max, work.context) == (300, 50, 50, 350)


def test_a_trace_plan_is_sized_for_the_trace_not_for_rate(tmp_path):
    """At 2 req/s of 256 in / 64 out one RTX 4090 meets a 0.5 s TTFT; sized from `--rate 50`
    the search started at more replicas and returned a dearer fleet than the cheapest."""
    trace = tmp_path / "t.jsonl"
    write_trace(trace, 300, 2.0)
    rc, out = plan("--workload", "trace", "--trace", str(trace), "--rate", "50")
    assert rc == 0, out
    assert out["replicas"] == 1
    assert out["meets_slo"]
    assert out["rate"] == pytest.approx(2.0, rel=0.2)
    assert "the trace's mean rate" in out["fleet"].splitlines()[0]
    one = out["usd_per_hour"]
    rc, burst = plan("--workload", "trace", "--trace", str(trace), "--rate", "2")
    assert rc == 0 and burst["usd_per_hour"] == one  # --rate plays no part in a trace's plan


def test_a_trace_with_no_time_span_is_refused(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 5, "input_length": 10, "max_tokens": 4})
                             + "\n" for _ in range(3)))
    rc, out = plan("--workload", "trace", "--trace", str(trace))
    assert rc == 2
    assert "one instant" in out["error"]


def test_a_rate_shape_is_planned_at_its_mean_rate():
    spec = WorkloadSpec(kind="random", rate=50.0, isl=64, osl=16, ignore_eos=True,
                        rate_shape="ramp:from=1,to=3,over=100", duration_s=100.0,
                        num_requests=0)
    work = observed_shape(spec, EOS_MEAN)
    assert work.rate == pytest.approx(2.0, rel=0.15)  # 200 arrivals over 100 s on average
    assert (work.prompt, work.output_max) == (64, 16)


def test_plan_takes_simulates_rate_shape_flag():
    """`plan --rate-shape` (a simulate workload flag) plans at the shape's mean rate and its
    reproducing command replays the same shape; with an explicit --rate it is refused, as
    simulate refuses it."""
    shape_flags = ["--rate-shape", "ramp:from=1,to=3,over=100", "--duration", "100",
                   "--isl", "64", "--osl", "16", "--ignore-eos"]
    rc, out = plan(*shape_flags)
    assert rc == 0, out
    assert out["rate"] == pytest.approx(2.0, rel=0.15)
    assert "--rate-shape ramp:from=1,to=3,over=100" in out["simulate_command"]
    assert "the mean of ramp:from=1,to=3,over=100" in out["fleet"].splitlines()[0]
    rc, err = plan(*shape_flags, "--rate", "5")
    assert rc == 2 and "--rate-shape replaces --rate" in err["error"]


def test_a_traces_shared_prefixes_are_taken_as_cached(tmp_path):
    """200 requests that all begin with one 1024-token document, then 64 tokens of their own:
    every prompt after the first prefills its own 64 at best (the prefill bound's prompt);
    the context is still the whole prompt's."""
    rng = np.random.default_rng(3)
    doc = rng.integers(1000, 30000, 1024).tolist()
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({
        "timestamp": 0.5 * i, "max_tokens": 8,
        "prompt_token_ids": doc + rng.integers(1000, 30000, 64).tolist()}) + "\n"
        for i in range(200)))
    work = observed_shape(WorkloadSpec(kind="trace", trace_path=str(trace)), EOS_MEAN)
    assert work.prompt == round((1088 + 199 * 64) / 200)
    assert work.context == 1088 + 8
    # a prefix shared only in part (its first 512 tokens) is cached only so far
    trace.write_text("".join(json.dumps({
        "timestamp": 0.5 * i, "max_tokens": 8,
        "prompt_token_ids": doc[:512] + rng.integers(1000, 30000, 576).tolist()}) + "\n"
        for i in range(200)))
    work = observed_shape(WorkloadSpec(kind="trace", trace_path=str(trace)), EOS_MEAN)
    assert work.prompt == round((1088 + 199 * 576) / 200)
