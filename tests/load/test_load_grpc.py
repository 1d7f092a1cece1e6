"""`clients.loadgen` against a real server: it agrees with virtual time, honours its bounds,
and counts errors by status code."""

from __future__ import annotations

import dataclasses

import pytest
from fleets import fleet_doc, make_fleet
from server_proc import ServerProcess

from clients.loadgen import run_load
from clients.report import summarize
from clients.workloads import WorkloadSpec, build_workload
from server.engine.tokenizer import get_tokenizer
from sim.simulation import simulate_conversations

VOCAB = get_tokenizer().vocab_size
HOST_S = 0.015  # wall seconds a busy 2-core host may add to one request (see below)


def slow_options(fleet):
    return next(d for d in fleet.deployments if d.name == "slow")


async def test_real_server_and_sim_agree_at_light_load_and_near_capacity():
    """Llama 3.1 70B Q4 on an RTX 4090 box (llama.cpp, one sequence at a time): the same
    open-loop workload through gRPC and in virtual time agree on throughput and median E2E.

    The server runs at time_scale 0.05 to keep the test short. Python gRPC adds ~5 ms of wall
    time to every request (send, then deliver the first chunk), which the client cannot tell
    from emulated time: 0.1 s emulated at this scale, ~4% of the ~2.7 s E2E compared here."""
    scale = 0.05
    fleet = make_fleet({"time_scale": scale})
    options = dataclasses.replace(slow_options(fleet), max_waiting=64)  # queue, never refuse
    fleet = dataclasses.replace(
        fleet, deployments=(options,),
        server=dataclasses.replace(fleet.server, default_deployment="slow"))
    base = WorkloadSpec(num_requests=1, isl=32, osl=8, ignore_eos=True, vocab_size=VOCAB,
                        seed=3)
    one, _ = simulate_conversations(options, base)
    capacity = 1.0 / one["e2e_s"]["mean"]  # requests per emulated second, one at a time
    slow = {**next(d for d in fleet_doc()["deployments"] if d["name"] == "slow"),
            "max_waiting": 64}
    with ServerProcess(fleet_doc({"time_scale": scale}, [slow])) as server:
        for load, n, tolerance in ((0.2, 8, 0.10), (0.8, 16, 0.20)):
            spec = dataclasses.replace(base, num_requests=n, rate=load * capacity)
            run = await run_load(server.target, build_workload(spec),
                                 deployment="slow", time_scale=scale)
            real = summarize(run.results)
            sim, _ = simulate_conversations(options, spec)
            assert real["requests"] == sim["requests"] == n
            # the client kept to its schedule: no request sent later than a quarter of the
            # mean gap between arrivals (at 0.05 wall s per emulated s, a 20 ms hiccup of the
            # client's process is 0.4 emulated s: a bound of 10% of one E2E, 12 ms of wall,
            # failed once on the 2-core CI machine under a parallel suite, with the comparison
            # below still inside its tolerance)
            assert run.max_send_lag_s < 0.25 / spec.rate
            assert real["output_tokens_per_s"] == pytest.approx(sim["output_tokens_per_s"],
                                                                rel=tolerance)
            # the host only adds to a request's wall time (gRPC's send and first chunk, ~5 ms
            # on an idle core; a clean clone's parallel suite on the 2-core machine once made
            # it 13.5 ms: +10.9% of E2E): faster than virtual time by more than the tolerance
            # fails, slower only beyond it plus HOST_S of wall time
            expected = sim["e2e_s"]["p50"]
            assert expected * (1 - tolerance) <= real["e2e_s"]["p50"] \
                <= expected * (1 + tolerance) + HOST_S / scale, (real["e2e_s"], expected)


async def test_closed_loop_never_exceeds_its_concurrency(server):
    spec = WorkloadSpec(num_requests=24, isl=16, osl=4, ignore_eos=True, vocab_size=VOCAB)
    run = await run_load(server.target, build_workload(spec), deployment="fast",
                         concurrency=3, time_scale=0.05)
    assert run.max_in_flight == 3
    assert len(run.results) == 24 and all(r.ok for r in run.results)
    # closed loop: each request is scheduled when it is sent
    assert all(r.scheduled_s == r.sent_s for r in run.results)


async def test_errors_are_counted_by_status_code(server):
    """'slow' runs one sequence and queues two more at most: a burst of eight sent at once
    gets two or three through (depending on whether the first already runs) and the rest are
    refused with RESOURCE_EXHAUSTED."""
    spec = WorkloadSpec(num_requests=8, isl=16, osl=2, ignore_eos=True, vocab_size=VOCAB)
    run = await run_load(server.target, build_workload(spec), deployment="slow",
                         time_scale=0.05)
    summary = summarize(run.results)
    refused = summary["errors"].get("RESOURCE_EXHAUSTED", 0)
    assert set(summary["errors"]) == {"RESOURCE_EXHAUSTED"}
    assert 2 <= summary["requests"] <= 3 and summary["requests"] + refused == 8


async def test_multi_turn_resends_the_history(server):
    spec = WorkloadSpec(kind="multi-turn", num_requests=2, turns=3, isl=20, osl=5,
                        ignore_eos=True, vocab_size=VOCAB)
    run = await run_load(server.target, build_workload(spec), deployment="fast",
                         time_scale=0.05)
    by_turn = sorted(run.results, key=lambda r: (r.conversation_id, r.turn))
    assert [r.prompt_tokens for r in by_turn] == [20, 45, 70] * 2
    assert all(r.cached_tokens > 0 for r in by_turn if r.turn > 0)
