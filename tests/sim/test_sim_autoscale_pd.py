"""Autoscaled disaggregated P/D pools in virtual time (sim/autoscale_pd.py): each role scales
on its own metric, a request waits at the router while a role has no ready replica, every
request is prefilled on a ready prefill slot and decoded on a ready decode slot, a draining
slot stays billed while KV is on its way to it, and nothing is left behind."""

from __future__ import annotations

import dataclasses
import json

from clients.workloads import WorkloadSpec, build_workload
from doppelchip.cli import main
from server.engine.options import EngineOptions
from server.engine.tokenizer import get_tokenizer
from sim.autoscale import DRAINING, READY, Autoscaler, Group
from sim.autoscale_policy import AutoscalePolicy
from sim.autoscaled import report, run_scaled

# Llama 2 13B on A100s with 4 sequences a step: a decode replica serves ~2 requests/s
A100 = EngineOptions(name="x", model="llama-2-13b", quant="bf16", chip="a100-sxm-80g",
                     engine="vllm", max_model_len=4096, max_num_seqs=4)
PREFILL = dataclasses.replace(A100, name="prefill", role="prefill", max_num_seqs=16)
DECODE = dataclasses.replace(A100, name="decode", role="decode")
POLICY = AutoscalePolicy(metric="waiting", target=2, min=1, max=3, sync_period_s=5,
                         scale_down_window_s=30, boot_s=10)
RAMP = "piecewise:0=0.5,20=0.5,30=4,70=4,75=0.3,160=0.3"


def sessions(**spec):
    tok = get_tokenizer()
    base = dict(kind="random", num_requests=0, isl=256, osl=64, ignore_eos=True, seed=5)
    return build_workload(WorkloadSpec(vocab_size=tok.vocab_size, **{**base, **spec}),
                          encode=tok.encode)


def slots_of(sr, name: str) -> list[int]:
    return next(g.slots for g in sr.groups if g.name == name)


def test_decode_pool_scales_out_in_the_ramp_and_back_in_while_prefill_keeps_up():
    sr = run_scaled([PREFILL, DECODE], [POLICY, POLICY], sessions(rate_shape=RAMP),
                    "least-requests")
    rep = report(sr)
    records = sr.cluster.run.records
    assert records and all(r.error is None for r in records)
    decode_events = rep["autoscaling"]["decode"]["events"]
    ups = [e for e in decode_events if e["to"] > e["from"]]
    assert ups and 20 <= ups[0]["t"] <= 45 and max(e["to"] for e in ups) == POLICY.max
    assert decode_events[-1]["to"] == POLICY.min  # back in after the plateau
    # the prefill pool (16 seats, one step a prompt) never queued enough to scale
    assert not [e for e in rep["autoscaling"]["prefill"]["events"] if e["to"] > e["from"]]
    decode, prefill = set(slots_of(sr, "decode")), set(slots_of(sr, "prefill"))
    assert {r.replica for r in records} <= decode and len({r.replica for r in records}) >= 3
    assert {r.prefill_replica for r in records} <= prefill
    # a slot booted by the autoscaler gets KV to decode only after the first boot is over
    booted = [r for r in records if r.replica != slots_of(sr, "decode")[0]]
    assert booted and min(r.prefill_end_s for r in booted) >= ups[0]["t"] + POLICY.boot_s
    # the KV of every request crossed the link once; every block is back on both sides
    assert sr.cluster.dispatch.links.transfers == len(records)
    for core in (r.core for r in sr.cluster.replicas):
        sched = core.scheduler
        assert not sched.held and not core.has_unfinished()
        sched.kv.check_integrity([])
        assert sched.pool.num_used == sched.cache.evictable_blocks  # only the cache holds KV


def test_requests_wait_at_the_router_while_the_decode_pool_wakes_from_zero():
    # inactive from the start (no cooldown): the decode pool is at zero before anything comes
    to_zero = dataclasses.replace(POLICY, metric="running", min=0, max=1, boot_s=20,
                                  cooldown_s=0)
    sr = run_scaled([PREFILL, DECODE], [POLICY, to_zero],
                    sessions(num_requests=6, rate=2.0), "round-robin")
    records = sr.cluster.run.records
    assert len(records) == 6 and all(r.error is None for r in records)
    wake = next(e for e in sr.groups[1].events if e["from"] == 0 and e["to"] == 1)
    ready = wake["t"] + to_zero.boot_s
    # they all arrived before it was ready and were held, none refused: nothing was
    # prefilled before the decode side had a ready replica to take the KV
    assert max(r.sent_s for r in records) < ready
    assert min(r.first_scheduled_s for r in records) >= ready
    assert all(r.replica == slots_of(sr, "decode")[0] for r in records)


def test_a_draining_slot_stays_billed_while_kv_is_on_its_way():
    sr = run_scaled([PREFILL, DECODE], [None, None], sessions(num_requests=1, rate=1.0),
                    "round-robin")
    cores = [r.core for r in sr.cluster.replicas]
    control = Autoscaler(cores, [Group("p", [0], None, 0.0, role="prefill"),
                                 Group("d", [1], None, 0.0, role="decode")], [1, 1],
                         "round-robin")
    assert control.state == [READY, READY]
    control._enter(1, DRAINING, 1.0)
    control.outstanding = [0, 1]  # a request routed to slot 1, its KV still in transit
    assert control.bill_idle(1, 2.0) and control.state[1] == DRAINING
    control.outstanding = [0, 0]
    assert not control.bill_idle(1, 3.0)  # nothing left: off, no longer billed


def test_simulate_autoscales_a_pd_fleet_and_reports_both_pools(capsys):
    code = main(["simulate", "--config", "examples/fleet-pd.toml", "--router", "least-requests",
                 "--num-requests", "60", "--rate", "4", "--isl", "512", "--osl", "32",
                 "--autoscale", "metric=waiting,target=2,min=1,max=2,boot_s=5", "--json"])
    assert code == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert s["requests"] == 60 and not s["errors"]
    assert set(s["autoscaling"]) == {"prefill", "decode"}
    assert {p["role"] for p in s["pools"]} == {"prefill", "decode"}
    assert sum(p.get("prefills", 0) for p in s["pools"]) == 60
    assert s["kv_transfers"]["count"] > 0
    # a pool counts the slots it ever provisioned, and costs what it was billed
    for p in s["pools"]:
        assert 1 <= p["replicas"] <= 2 and p["usd_per_hour"] > 0
