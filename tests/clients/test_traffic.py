"""Traffic shapes: arrival processes (rate, dispersion, ramp-up), length distributions, and
exact trace replay."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clients.arrivals import arrival_times
from clients.workloads import WorkloadSpec, build_workload
from doppelchip.cli import main


@pytest.mark.parametrize(("kind", "shape", "cv"), [("constant", 1.0, 0.0), ("poisson", 1.0, 1.0),
                                                   ("gamma", 0.25, 2.0), ("gamma", 4.0, 0.5)])
def test_arrivals_have_their_mean_rate_and_dispersion(kind, shape, cv):
    """Gap coefficient of variation: 0 constant, 1 Poisson, 1/sqrt(shape) for gamma."""
    times = arrival_times(20_000, 50.0, kind, np.random.default_rng(7), burstiness=shape)
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1 / 50.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, abs=0.06)


def test_ramp_up_grows_the_rate_linearly_then_holds_it():
    times = np.array(arrival_times(40_000, 100.0, "poisson", np.random.default_rng(3),
                                   ramp_up_s=100.0))
    # expected arrivals by t during a 100 s ramp to 100/s: 100 t^2 / 200 (within 4 sigma of a
    # Poisson count)
    for t in (20.0, 50.0, 100.0):
        expected = 100 * t * t / 200
        assert (times < t).sum() == pytest.approx(expected, abs=4 * expected**0.5)
    # after the ramp: 100/s
    assert ((times >= 150) & (times < 250)).sum() == pytest.approx(10_000, abs=400)


@pytest.mark.parametrize("dist", ["uniform", "normal"])
def test_length_distributions(dist):
    spec = WorkloadSpec(num_requests=2000, isl=100, osl=50, length_dist=dist,
                        length_spread=0.2, seed=1)
    convs = build_workload(spec)
    isl = np.array([len(c.turns[0].user_ids) for c in convs])
    osl = np.array([c.turns[0].max_tokens for c in convs])
    assert isl.mean() == pytest.approx(100, rel=0.03) and osl.mean() == pytest.approx(50, rel=0.03)
    if dist == "uniform":
        assert isl.min() == 80 and isl.max() == 120
        assert isl.std() == pytest.approx(40 / np.sqrt(12), rel=0.1)
    else:
        assert isl.std() == pytest.approx(20, rel=0.1)
    assert build_workload(spec) == convs  # seeded


def test_fixed_lengths_keep_earlier_workloads_unchanged():
    a = build_workload(WorkloadSpec(num_requests=5, isl=10, osl=3, seed=4))
    assert all(len(c.turns[0].user_ids) == 10 and c.turns[0].max_tokens == 3 for c in a)


def test_trace_replays_exactly(tmp_path, capsys):
    lines = [
        {"timestamp": 100.0, "prompt_token_ids": [20, 21, 22, 23, 24], "max_tokens": 7},
        {"timestamp": 100.5, "input_length": 40, "output_length": 3},
        {"timestamp": 102.25, "prompt": "the quick brown fox", "max_tokens": 5},
        {"timestamp": 101.0, "input_length": 9, "max_tokens": 2},
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = tmp_path / "out.json"
    assert main(["load", "--target", "sim:", "--workload", "trace", "--trace", str(trace),
                 "--output-json", str(out), "--json"]) == 0
    capsys.readouterr()
    records = sorted(json.loads(out.read_text())["requests"], key=lambda r: r["scheduled_s"])
    assert [r["scheduled_s"] for r in records] == [0.0, 0.5, 1.0, 2.25]
    assert [r["output_tokens"] for r in records] == [7, 3, 2, 5]
    assert [r["prompt_tokens"] for r in records[:2]] == [5, 40]
    from server.engine.tokenizer import get_tokenizer

    assert records[3]["prompt_tokens"] == len(get_tokenizer().encode("the quick brown fox"))


def test_bad_trace_lines_are_named(tmp_path, capsys):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 4, "max_tokens": 2}\n{"timestamp": 1}\n')
    assert main(["simulate", "--workload", "trace", "--trace", str(trace), "--json"]) == 2
    assert "bad.jsonl:2: max_tokens" in capsys.readouterr().err


def test_length_histogram_file(tmp_path):
    hist = tmp_path / "lengths.csv"
    hist.write_text("input,output,weight\n100,10,3\n# a comment\n400,40,1\n")
    convs = build_workload(WorkloadSpec(num_requests=4000, length_dist="histogram",
                                        length_file=str(hist), seed=5))
    pairs = [(len(c.turns[0].user_ids), c.turns[0].max_tokens) for c in convs]
    assert set(pairs) == {(100, 10), (400, 40)}
    assert pairs.count((100, 10)) / len(pairs) == pytest.approx(0.75, abs=0.03)
    bad = tmp_path / "bad.csv"
    bad.write_text("100,10\n")
    with pytest.raises(ValueError, match=r"bad\.csv:1: expected input,output,weight"):
        build_workload(WorkloadSpec(num_requests=2, length_dist="histogram",
                                    length_file=str(bad)))


def test_mix_interleaves_workloads_by_weight():
    spec = WorkloadSpec(kind="mix", num_requests=1000, rate=50.0, isl=16, osl=4, turns=2,
                        system_prompt_len=32,
                        mix=(("random", 0.5), ("shared-prefix", 0.3), ("multi-turn", 0.2)))
    convs = build_workload(spec)
    kinds = [c.conversation_id[0] for c in convs]
    assert kinds.count("r") / 1000 == pytest.approx(0.5, abs=0.05)
    assert kinds.count("p") / 1000 == pytest.approx(0.3, abs=0.05)
    assert kinds.count("c") / 1000 == pytest.approx(0.2, abs=0.05)
    assert [c.start_s for c in convs] == sorted(c.start_s for c in convs)
    assert len({c.start_s for c in convs}) == 1000  # one shared arrival stream
    assert all(len(c.turns) == 2 for c in convs if c.conversation_id[0] == "c")
    assert build_workload(spec) == convs
    with pytest.raises(ValueError, match="mix needs weights"):
        build_workload(WorkloadSpec(kind="mix", mix=(("trace", 1.0),)))


def test_summary_percentiles_match_a_hand_computation():
    from clients.report import RequestResult, summarize

    # ten requests with TTFTs 0.1 … 1.0 s and E2Es 1 … 10 s
    rows = [RequestResult(f"r{i}", 0.0, 0.0, (0.1 * i, 0.1 * i + 0.05), float(i), 8, 2)
            for i in range(1, 11)]
    s = summarize(rows)
    ttfts = sorted(0.1 * i for i in range(1, 11))
    # linear interpolation between closest ranks, as numpy's default percentile does:
    # p50 sits halfway between the 5th and 6th values, p90 at 9.1/9 of the way, ...
    assert s["ttft_s"]["p50"] == pytest.approx((ttfts[4] + ttfts[5]) / 2)
    assert s["ttft_s"]["p90"] == pytest.approx(ttfts[8] + 0.1 * (ttfts[9] - ttfts[8]))
    assert s["ttft_s"]["p99"] == pytest.approx(ttfts[8] + 0.91 * (ttfts[9] - ttfts[8]))
    assert s["e2e_s"]["p50"] == pytest.approx(5.5) and s["e2e_s"]["mean"] == pytest.approx(5.5)
    assert s["itl_s"]["p99"] == pytest.approx(0.05) and s["tpot_s"]["mean"] == pytest.approx(0.05)
