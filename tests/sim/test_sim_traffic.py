"""Traffic over time (issue 16): non-homogeneous Poisson arrivals follow their rate curve, and
the public trace formats (Azure, BurstGPT, Mooncake) load their committed samples with the
right arrivals and lengths — Mooncake's shared hash_ids becoming prefix-cache hits."""

from __future__ import annotations

import csv
import itertools
import json
import math
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from clients.arrivals import parse_rate_shape, shaped_arrival_times
from clients.trace import load_trace
from clients.trace_formats import MOONCAKE_BLOCK, sniff
from doppelchip.cli import main

TRACES = Path(__file__).resolve().parents[2] / "examples" / "traces"
VOCAB = 32000


def expected_count(shape, a: float, b: float) -> float:
    """∫ rate over [a, b) by the trapezoid rule on a fine grid (independent of the sampler)."""
    xs = np.linspace(a, b, 2001)
    return float(np.trapezoid([shape.rate(x) for x in xs], xs))


@pytest.mark.parametrize("spec", ["diurnal:period=600,min=2,max=20",
                                  "burst:low=1,high=15,on=30,off=90",
                                  "ramp:from=0,to=20,over=600"])
def test_shaped_arrivals_follow_the_rate_curve(spec):
    """Counts in 60-s bins are Poisson with mean ∫rate: every bin within 4 standard
    deviations, and the whole run's chi-square below its 99.9 % point (seed fixed)."""
    shape = parse_rate_shape(spec)
    times = shaped_arrival_times(shape, np.random.default_rng(7), duration_s=1200)
    assert times == sorted(times) and times[0] >= 0 and times[-1] < 1200
    edges = np.arange(0, 1201, 60)
    counts, _ = np.histogram(times, bins=edges)
    means = np.array([expected_count(shape, a, b) for a, b in itertools.pairwise(edges)])
    assert np.all(np.abs(counts - means) <= 4 * np.sqrt(means) + 1)
    chi2 = float(np.sum((counts - means) ** 2 / means))
    assert chi2 < 45.3  # chi-square, 20 degrees of freedom, 99.9 %
    # the curve, not a flat rate: the busiest bin has many times the quietest's arrivals
    assert counts.max() > 4 * max(1, counts.min())


def test_shaped_arrivals_are_seeded_and_stop_where_asked():
    shape = parse_rate_shape("diurnal:period=100,min=1,max=9")
    a = shaped_arrival_times(shape, np.random.default_rng(1), n=50)
    assert a == shaped_arrival_times(shape, np.random.default_rng(1), n=50) and len(a) == 50
    assert a != shaped_arrival_times(shape, np.random.default_rng(2), n=50)
    piece = parse_rate_shape("piecewise:0=5,10=5,20=0")
    assert max(shaped_arrival_times(piece, np.random.default_rng(1))) < 20  # it ends at 20 s
    with pytest.raises(ValueError, match="for ever"):
        shaped_arrival_times(shape, np.random.default_rng(1))
    for bad in ("sine:period=1", "diurnal:period=0,min=1,max=2", "burst:low=1", "ramp:from=x",
                "piecewise:0=1", "diurnal:period=10,min=0,max=0"):
        with pytest.raises(ValueError):
            parse_rate_shape(bad)


def test_simulate_rate_shape_flags(capsys):
    base = ["simulate", "--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b",
            "--quant", "bf16", "--isl", "32", "--osl", "8", "--ignore-eos", "--json"]
    assert main([*base, "--rate-shape", "piecewise:0=2,30=10,60=2", "--seed", "4"]) == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 200 < s["requests"] < 400  # ∫ rate = 360, Poisson
    assert main([*base, "--rate-shape", "diurnal:period=60,min=1,max=5"]) == 2
    assert "for ever" in capsys.readouterr().err
    assert main([*base, "--rate-shape", "ramp:from=1,to=2,over=5", "--rate", "3",
                 "--duration", "5"]) == 2
    assert "replaces --rate" in capsys.readouterr().err


def test_azure_trace_sample():
    path = TRACES / "azure_conv_sample.csv"
    assert sniff(path) == "azure"
    rows = list(csv.DictReader(path.open()))
    convs = load_trace(path, VOCAB, seed=1)
    stamps = [datetime.strptime(r["TIMESTAMP"][:26], "%Y-%m-%d %H:%M:%S.%f").timestamp()
              + float("0.000000" + r["TIMESTAMP"][26:]) for r in rows]
    assert len(convs) == len(rows) == 36
    for c, r, t in zip(convs, rows, stamps, strict=True):
        assert c.start_s == pytest.approx(t - stamps[0], abs=1e-6)
        assert len(c.turns[0].user_ids) == int(r["ContextTokens"])
        assert c.turns[0].max_tokens == int(r["GeneratedTokens"])
    # 18:15:46.4290847 → 18:15:46.9475450: the 7th fractional digit is kept
    assert convs[1].start_s == pytest.approx(0.5184603, abs=1e-6)


def test_burstgpt_trace_sample_skips_failed_requests():
    path = TRACES / "burstgpt_sample.csv"
    assert sniff(path) == "burstgpt"
    rows = [r for r in csv.DictReader(path.open())]
    ok = [r for r in rows if int(r["Response tokens"]) > 0]
    assert len(ok) == len(rows) - 2  # the sample has two failures
    convs = load_trace(path, VOCAB)
    assert len(convs) == len(ok)
    t0 = float(ok[0]["Timestamp"])
    for c, r in zip(convs, ok, strict=True):
        assert c.start_s == float(r["Timestamp"]) - t0
        assert (len(c.turns[0].user_ids), c.turns[0].max_tokens) == (
            int(r["Request tokens"]), int(r["Response tokens"]))


def test_mooncake_trace_sample_shares_blocks_by_hash_id():
    path = TRACES / "mooncake_sample.jsonl"
    assert sniff(path) == "mooncake"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    convs = load_trace(path, VOCAB)
    assert [c.start_s for c in convs] == pytest.approx(
        [(r["timestamp"] - rows[0]["timestamp"]) / 1000 for r in rows])  # milliseconds
    prompts = [c.turns[0].user_ids for c in convs]
    assert [len(p) for p in prompts] == [r["input_length"] for r in rows]
    assert [c.turns[0].max_tokens for c in convs] == [r["output_length"] for r in rows]
    # equal leading hash ids are equal tokens, block by block; a different id differs
    for a in range(len(rows)):
        for b in range(a):
            ha, hb = rows[a]["hash_ids"], rows[b]["hash_ids"]
            same = next((i for i, (x, y) in enumerate(zip(ha, hb, strict=False)) if x != y),
                        min(len(ha), len(hb)))
            n = min(same * MOONCAKE_BLOCK, len(prompts[a]), len(prompts[b]))
            assert prompts[a][:n] == prompts[b][:n]
            if same < min(len(ha), len(hb)):
                k = same * MOONCAKE_BLOCK
                assert prompts[a][k:k + 16] != prompts[b][k:k + 16]


def test_mooncake_sample_hits_the_prefix_cache(tmp_path, capsys):
    """The same requests without their hash_ids (random prompts of the same lengths, this
    project's JSONL) get no hits; with them the shared system-prompt blocks are hits."""
    sample = TRACES / "mooncake_sample.jsonl"
    rows = [json.loads(line) for line in sample.read_text().splitlines()]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"timestamp": r["timestamp"] / 1000,
                                         "input_length": r["input_length"],
                                         "max_tokens": r["output_length"]}) + "\n"
                             for r in rows))
    base = ["simulate", "--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b",
            "--quant", "bf16", "--max-model-len", "8192", "--workload", "trace", "--json"]
    hits = {}
    for name, path in (("mooncake", sample), ("plain", plain)):
        assert main([*base, "--trace", str(path)]) == 0
        hits[name] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert hits["plain"]["prefix_cache_hit_rate"] == 0
    # blocks shared with an earlier row: a lower bound on what the cache can hit
    seen: set[int] = set()
    shared = 0
    for r in rows:
        lead = 0
        for h in r["hash_ids"]:
            if h not in seen:
                break
            lead += 1
        shared += min(lead * MOONCAKE_BLOCK, r["input_length"] - 1) // 16 * 16
        seen.update(r["hash_ids"])
    assert hits["mooncake"]["cached_prompt_tokens"] >= 0.9 * shared > 0
    assert hits["mooncake"]["prefix_cache_hit_rate"] > 0.3
    assert main([*base, "--trace", str(sample), "--trace-format", "azure"]) == 2
    assert "missing column" in capsys.readouterr().err
    assert math.isfinite(hits["mooncake"]["ttft_s"]["p99"])


def test_rate_shape_takes_the_place_of_the_default_rate_not_a_given_one(capsys):
    """simulate's --rate has a finite default (10/s): --rate-shape alone runs, with an
    explicit --rate it is a usage error."""
    from doppelchip.cli import main

    shape = ["simulate", "--rate-shape", "ramp:from=1,to=5,over=20", "--duration", "20",
             "--isl", "32", "--osl", "8", "--json"]
    assert main(shape) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["requests"] > 0
    assert main([*shape, "--rate", "3"]) == 2
    assert "--rate-shape replaces --rate" in capsys.readouterr().err
