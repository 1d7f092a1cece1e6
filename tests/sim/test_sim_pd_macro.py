"""Macro-stepping a disaggregated P/D fleet gives the very run single-stepping gives: a
decode replica's window is bounded by the other replicas' steps in flight (a prefill ending
there hands its request to a decode replica, which pulls the KV when it admits it) as well as
by the arrivals, and no window runs while a pull is in flight. Same records (by request),
tokens and counters (times to 1e-9 relative), and windows really ran."""

from __future__ import annotations

import math

import pytest
from fleet_helpers import H100, assert_all_released, pool, sessions
from macro_helpers import count_window_steps

import sim.virtual as virtual
from sim.cluster import build_replicas, run_replicas

A100 = pool(H100, "a100", chip="a100-sxm-80g")
FLEETS = {
    "2+2 h100": [pool(H100, "p", replicas=2, role="prefill"),
                 pool(H100, "d", replicas=2, role="decode")],
    "1 h100 + 3 a100": [pool(H100, "p", role="prefill"),
                        pool(A100, "d", replicas=3, role="decode", max_num_seqs=16)],
    # vLLM 0.34.0's cap: pulls start while every seat is taken
    "1 h100 + 2 a100, 8 seats, cap 4": [pool(H100, "p", role="prefill"),
                                        pool(A100, "d", replicas=2, role="decode",
                                             max_num_seqs=8, max_num_inflight_kv_loads=4)],
}
WORKLOADS = {
    "long prompts": dict(kind="random", num_requests=60, isl=2048, osl=96, rate=8.0),
    "eos, spread": dict(kind="random", num_requests=80, isl=300, osl=200, rate=20.0,
                        ignore_eos=False, length_dist="uniform", length_spread=0.5),
    "burst": dict(kind="random", num_requests=40, isl=512, osl=64, rate=math.inf),
}


def _run(fleet, work, macro: bool, monkeypatch) -> tuple:
    steps = count_window_steps(monkeypatch)
    monkeypatch.setitem(virtual.MACRO_STEPS, "default", macro)
    cr = run_replicas(build_replicas(fleet), work, "least-requests")
    assert_all_released(cr)
    # in request order: a window delivers its finishes when it starts, so a list of records
    # in the order they were appended interleaves the replicas otherwise
    recs = sorted(cr.run.records, key=lambda r: r.request_id)
    rows = [(r.request_id, r.output_tokens, r.replica, r.prefill_replica, r.finish_reason,
             r.error) for r in recs]
    times = [(r.token_times, r.end_s, r.prefill_end_s, r.kv_transfer_s) for r in recs]
    counters = [(r.core.scheduler.stats.num_steps, r.core.scheduler.stats.num_generation_tokens,
                 r.core.stats.steps) for r in cr.replicas]
    floats = [(r.core.stats.busy_s, r.core.stats.joules) for r in cr.replicas]
    return rows, counters, times, floats, cr.run.duration_s, steps[0]


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("fleet", FLEETS)
@pytest.mark.parametrize("workload", WORKLOADS)
def test_pd_fleet_is_the_same_macro_or_single_stepped(fleet, workload, monkeypatch):
    work = sessions(**WORKLOADS[workload])
    single = _run(FLEETS[fleet], work, False, monkeypatch)
    macro = _run(FLEETS[fleet], work, True, monkeypatch)
    assert single[5] == 0 and macro[5] > 0  # windows ran only when macro-stepping
    assert single[:2] == macro[:2]
    for (t1, *e1), (t2, *e2) in zip(single[2], macro[2], strict=True):
        assert len(t1) == len(t2) and all(map(_close, t1, t2))
        assert all(map(_close, e1, e2))
    for f1, f2 in zip(single[3], macro[3], strict=True):
        assert all(map(_close, f1, f2))
    assert _close(single[4], macro[4])
