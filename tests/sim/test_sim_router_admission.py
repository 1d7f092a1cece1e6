"""Admission control at a fleet's router (issue 16; sim/admission.py, after the Gateway API
inference extension's saturation detectors): it bounds every replica's outstanding requests,
lowers the tail TTFT of what it admits under overload, and what it refuses never reaches a
replica (RESOURCE_EXHAUSTED records, no KV)."""

from __future__ import annotations

import json

import pytest
from fleet_helpers import H100, assert_all_released, pool, run, sessions

from doppelchip.cli import main
from sim.admission import Admission, parse_admission

OVERLOAD = dict(kind="random", num_requests=120, isl=1024, osl=64, rate=120.0)
FLEET = [pool(H100, "gpu", replicas=2)]


def peak_outstanding(records, replica: int) -> int:
    """The most requests replica `replica` had between arrival and end at once (the router's
    count: an admitted request is outstanding from its arrival to its last token)."""
    events = sorted([(r.scheduled_s, 1) for r in records if r.replica == replica]
                    + [(r.end_s, -1) for r in records if r.replica == replica],
                    key=lambda e: (e[0], e[1]))  # an end before an arrival at one instant
    peak = now = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


@pytest.mark.parametrize("router", ["round-robin", "least-requests", "p2c"])
def test_max_outstanding_bounds_every_replica(router):
    work = sessions(**OVERLOAD)
    free, _, _ = run(FLEET, router, work)
    assert max(peak_outstanding(free.run.records, k) for k in (0, 1)) > 8  # it is overloaded
    cr, _, s = run(FLEET, router, work, admission=Admission(max_outstanding=8))
    admitted = [r for r in cr.run.records if r.error is None]
    refused = [r for r in cr.run.records if r.error is not None]
    assert refused and len(admitted) + len(refused) == 120
    assert all(peak_outstanding(cr.run.records, k) <= 8 for k in (0, 1))
    assert s["errors"] == {"RESOURCE_EXHAUSTED": len(refused)} == {
        "RESOURCE_EXHAUSTED": cr.dispatch.refused}
    for r in refused:  # refused at the router: on no replica, never scheduled, no tokens
        assert r.replica == -1 and r.first_scheduled_s is None and not r.token_times
    # refused requests never reached a scheduler: the replicas saw only the admitted ones
    assert sum(r.core.scheduler.stats.num_finished for r in cr.replicas) == len(admitted)
    assert_all_released(cr)


def test_admission_lowers_the_tail_ttft_of_admitted_requests():
    work = sessions(**OVERLOAD)
    _, _, free = run(FLEET, "least-requests", work)
    _, _, gated = run(FLEET, "least-requests", work, admission=Admission(max_outstanding=8))
    assert gated["requests"] < free["requests"] == 120
    assert gated["ttft_s"]["p99"] < free["ttft_s"]["p99"] / 2


def test_queue_depth_refuses_when_every_replica_has_a_queue():
    rule = parse_admission("queue-depth=2")
    burst = sessions(**{**OVERLOAD, "rate": float("inf")})  # all at t = 0, before any step:
    cr, _, s = run(FLEET, "round-robin", burst, admission=rule)
    assert s["requests"] == 2 * 2  # every routed request waits: two per replica's queue
    assert s["errors"] == {"RESOURCE_EXHAUSTED": 120 - 4}
    assert_all_released(cr)
    cr, _, s = run(FLEET, "round-robin", sessions(**OVERLOAD), admission=rule)
    assert 4 < s["requests"] < 120  # spread arrivals: queues drain between them
    assert_all_released(cr)


def test_parse_admission():
    assert parse_admission("max-outstanding=4") == Admission(max_outstanding=4)
    assert parse_admission("queue-depth=3") == Admission(queue_depth=3, kv_util=0.8)
    assert parse_admission("kv-util=0.5") == Admission(queue_depth=5, kv_util=0.5)
    assert parse_admission("") is None
    for bad, why in (("max-outstanding=0", "integer >= 1"), ("kv-util=2", r"\(0, 1\]"),
                     ("tokens=3", "bad --admission term"), ("max-outstanding=x", "number")):
        with pytest.raises(ValueError, match=why):
            parse_admission(bad)


def test_the_command_counts_refusals(capsys):
    args = ["simulate", "--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b",
            "--quant", "bf16", "--max-model-len", "2048", "--num-requests", "30", "--isl", "256",
            "--osl", "16", "--rate", "inf", "--admission", "max-outstanding=5"]
    assert main([*args, "--json"]) == 0
    s = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert s["admission_refused"] == 25 == s["errors"]["RESOURCE_EXHAUSTED"]
    assert s["requests"] == 5
    assert main(args) == 0
    assert "25 requests refused at the router" in capsys.readouterr().out
    assert main([*args[:-1], "max-outstanding=-1"]) == 2
    assert "integer >= 1" in capsys.readouterr().err


def test_a_critical_class_is_never_shed_and_queues_past_the_limit():
    """GIE's priority: when every replica is saturated only sheddable classes are refused; a
    critical class goes to the picker's choice anyway (to queue on the model server)."""
    work = sessions(**OVERLOAD, slo_class_mix=(("interactive", 0.3), ("batch", 0.7)))
    shed_all, _, _ = run(FLEET, "least-requests", work, admission=Admission(max_outstanding=8))
    refused = [r for r in shed_all.run.records if r.error is not None]
    assert {r.slo_class for r in refused} == {"interactive", "batch"}
    cr, _, _ = run(FLEET, "least-requests", work,
                   admission=Admission(max_outstanding=8, critical=("interactive",)))
    records = cr.run.records
    inter = [r for r in records if r.slo_class == "interactive"]
    assert inter and all(r.error is None for r in inter)  # not one shed
    assert any(r.error is not None for r in records if r.slo_class == "batch")
    assert max(peak_outstanding(records, k) for k in (0, 1)) > 8  # queued past the limit
    assert_all_released(cr)
    assert parse_admission("max-outstanding=8,critical=interactive+chat").critical == (
        "interactive", "chat")
    for bad in ("critical=interactive", "max-outstanding=8,critical=", "max-outstanding=8,"
                "critical=a++b"):
        with pytest.raises(ValueError):
            parse_admission(bad)
