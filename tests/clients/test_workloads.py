"""Workload generators, arrival processes and the summary report."""

from __future__ import annotations

import math

import numpy as np
import pytest

from clients.arrivals import arrival_times
from clients.conversation import FIRST_ORDINARY_ID
from clients.report import RequestResult, stats, summarize
from clients.workloads import WorkloadSpec, build_workload


def test_random_workload_is_reproducible_and_sized():
    spec = WorkloadSpec(kind="random", num_requests=20, isl=50, osl=7, rate=10.0, seed=3)
    a, b = build_workload(spec), build_workload(spec)
    assert a == b
    assert len(a) == 20 and all(len(c.turns) == 1 for c in a)
    assert all(len(c.turns[0].user_ids) == 50 and c.turns[0].max_tokens == 7 for c in a)
    assert all(FIRST_ORDINARY_ID <= t < spec.vocab_size for c in a for t in c.turns[0].user_ids)
    starts = [c.start_s for c in a]
    assert starts == sorted(starts) and starts[0] == 0.0
    assert build_workload(WorkloadSpec(num_requests=20, seed=4)) != a


def test_shared_prefix_groups_share_exactly_the_system_prompt():
    spec = WorkloadSpec(kind="shared-prefix", num_requests=12, num_prefixes=3,
                        system_prompt_len=100, isl=20, osl=5)
    convs = build_workload(spec)
    groups: dict[tuple[int, ...], int] = {}
    for c in convs:
        ids = c.turns[0].user_ids
        assert len(ids) == 120
        groups[ids[:100]] = groups.get(ids[:100], 0) + 1
    assert sorted(groups.values()) == [4, 4, 4]
    # the questions differ, so no two prompts share more than the system prompt (by chance)
    assert len({c.turns[0].user_ids for c in convs}) == 12


def test_multi_turn_has_the_asked_turns_and_think_time():
    convs = build_workload(WorkloadSpec(kind="multi-turn", num_requests=5, turns=4, isl=10,
                                        osl=3, think_time_s=0.5))
    assert all(len(c.turns) == 4 for c in convs)
    assert [t.think_time_s for t in convs[0].turns] == [0.0, 0.5, 0.5, 0.5]


@pytest.mark.parametrize("bad", [dict(num_requests=0), dict(isl=0), dict(kind="nope"),
                                 dict(kind="shared-prefix", num_prefixes=0),
                                 dict(kind="multi-turn", turns=0), dict(rate=0.0),
                                 dict(osl=(1 << 24) + 1)])
def test_bad_workload_arguments(bad):
    with pytest.raises(ValueError):
        build_workload(WorkloadSpec(**bad))


def test_arrival_processes_have_the_asked_rate():
    rng = np.random.default_rng(0)
    for kind in ("poisson", "constant", "gamma"):
        t = arrival_times(4000, 20.0, kind, rng, burstiness=0.5)
        assert t[0] == 0.0 and t == sorted(t)
        assert math.isclose(len(t) / t[-1], 20.0, rel_tol=0.1)
    assert arrival_times(3, float("inf"), "poisson", rng) == [0.0, 0.0, 0.0]
    gaps = {k: np.diff(arrival_times(4000, 20.0, k, np.random.default_rng(1), 0.25))
            for k in ("constant", "poisson", "gamma")}
    cv = {k: g.std() / g.mean() for k, g in gaps.items()}
    assert cv["constant"] < 1e-9 < cv["poisson"] < cv["gamma"]  # burstier is more variable


def test_summary_from_known_results():
    results = [
        RequestResult("a", 0.0, 0.0, (0.1, 0.2, 0.3), 0.3, prompt_tokens=10, output_tokens=3),
        RequestResult("b", 1.0, 1.0, (1.3, 1.7), 1.7, prompt_tokens=10, output_tokens=2,
                      cached_tokens=8),
        RequestResult("c", 1.5, 1.5, (), 1.6, 10, 0, error="RESOURCE_EXHAUSTED"),
    ]
    s = summarize(results, preemptions=0)
    assert s["requests"] == 2 and s["errors"] == {"RESOURCE_EXHAUSTED": 1}
    assert math.isclose(s["duration_s"], 1.7)
    assert math.isclose(s["output_tokens_per_s"], 5 / 1.7)
    assert math.isclose(s["ttft_s"]["mean"], (0.1 + 0.3) / 2)
    assert math.isclose(s["tpot_s"]["mean"], (0.1 + 0.4) / 2)
    assert sorted(round(x, 9) for x in [0.1, 0.1, 0.4]) == sorted(
        round(x, 9) for r in results[:2] for x in r.itls())
    assert math.isclose(s["itl_s"]["p50"], 0.1)
    assert s["cached_prompt_tokens"] == 8 and s["preemptions"] == 0
    assert stats([])["p99"] == 0.0


@pytest.mark.parametrize("kind", ["random", "shared-prefix", "multi-turn", "structured"])
def test_prompts_drawn_in_blocks_are_the_ones_drawn_one_by_one(kind, monkeypatch):
    """Fixed-length prompts are drawn a block at a time (`_id_rows`); the workload is the one
    drawn prompt by prompt, across block boundaries (70 requests: a block and a part)."""
    import clients.workloads as workloads

    spec = WorkloadSpec(kind=kind, num_requests=70, isl=9, osl=5, rate=10, seed=4,
                        system_prompt_len=7, turns=2)
    blocks = build_workload(spec)
    monkeypatch.setattr(workloads, "_id_rows", lambda rng, k, n, v: [
        workloads._ids(rng, n, v) for _ in range(k)])
    assert build_workload(spec) == blocks
    monkeypatch.setattr(workloads, "_BLOCK", 1)
    assert build_workload(spec) == blocks


def test_long_prompts_are_drawn_in_smaller_blocks(monkeypatch):
    """A block holds at most `_BLOCK_TOKENS` ids (64 prompts of a million tokens were 6 GB of
    Python ints); the prompts are the same as with whole blocks."""
    import clients.workloads as workloads

    spec = WorkloadSpec(num_requests=10, isl=300, osl=5, rate=10, seed=2)
    whole = build_workload(spec)
    sizes = []
    draw = workloads._id_rows
    monkeypatch.setattr(workloads, "_id_rows", lambda rng, k, n, v: sizes.append(k) or
                        draw(rng, k, n, v))
    monkeypatch.setattr(workloads, "_BLOCK_TOKENS", 1000)
    assert build_workload(spec) == whole
    assert sizes == [3, 3, 3, 1]  # 1000 // 300 prompts a block
