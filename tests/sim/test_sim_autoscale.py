"""Autoscaling in virtual time (sim/autoscale.py): the HPA's arithmetic, a run that scales out
during a traffic ramp and back in after it, the cold-start dip on the emulated timeline,
billing only while provisioned, and the cold start taken from the device model."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from clients.workloads import WorkloadSpec, build_workload
from doppelchip.cli import main
from server.engine.build import build_core
from server.engine.options import EngineOptions
from server.engine.tokenizer import get_tokenizer
from sim.admission import Admission
from sim.autoscale_hpa import hpa_recommendation, stabilised
from sim.autoscale_policy import AutoscalePolicy, parse_policy
from sim.autoscaled import report, run_scaled

# Llama 2 13B on an A100 with 4 sequences a step: ~2 requests/s a replica at 96 output tokens
A100 = EngineOptions(name="a100", model="llama-2-13b", quant="bf16", chip="a100-sxm-80g",
                     engine="vllm", max_model_len=2048, max_num_seqs=4)
POLICY = AutoscalePolicy(metric="waiting", target=2, min=1, max=3, sync_period_s=5,
                         scale_down_window_s=60, boot_s=20)
# 1 req/s, a ramp to 5 req/s over 20-35 s, 5 req/s until 80 s, down to 0.5 req/s by 90 s
RAMP = "piecewise:0=1,20=1,35=5,80=5,90=0.5,170=0.5"


def sessions(**spec):
    tok = get_tokenizer()
    base = dict(kind="random", num_requests=0, isl=64, osl=96, seed=3)
    return build_workload(WorkloadSpec(vocab_size=tok.vocab_size, **{**base, **spec}),
                          encode=tok.encode)


@pytest.fixture(scope="module")
def ramp_run():
    sr = run_scaled([A100], [POLICY], sessions(rate_shape=RAMP), "least-requests")
    return sr, report(sr)


def test_hpa_recommendation_follows_the_kubernetes_formula():
    # desired = ceil(current × metric / target), within the 10 % tolerance: no change
    assert hpa_recommendation(2, [9.0, 9.0], 0, 4.0, 0.1) == 5  # ceil(2 × 9/4)
    assert hpa_recommendation(2, [4.2, 4.2], 0, 4.0, 0.1) == 2  # ratio 1.05: tolerated
    assert hpa_recommendation(4, [1.0] * 4, 0, 4.0, 0.1) == 1
    # a booting pod has no metric: 0 when scaling up, the target when scaling down
    assert hpa_recommendation(3, [12.0, 12.0], 1, 4.0, 0.1) == 6  # (24 + 0) / 4 / 3 · 3
    assert hpa_recommendation(3, [0.0, 0.0], 1, 4.0, 0.1) == 1  # (0 + 4) / 4 / 3 · 3
    # ... and if that reverses the direction, nothing happens
    assert hpa_recommendation(3, [4.8, 4.8], 1, 4.0, 0.1) == 3


def test_stabilisation_window_keeps_the_highest_recent_recommendation():
    # KEP-853's example: one recommendation a minute, a 600 s scale-down window
    recs = [10, 9, 8, 9, 9, 8, 9, 8, 9]
    history = [(60.0 * i, r) for i, r in enumerate(recs)]
    assert stabilised(history, 540.0, 8, 10, 0.0, 600.0) == 10  # the 10 is still in
    history = [(60.0 * i, r) for i, r in enumerate([*recs, 8])][1:]
    assert stabilised(history, 600.0, 7, 10, 0.0, 600.0) == 9
    # scale-up has no window by default: the recommendation at once
    assert stabilised([(0.0, 1)], 15.0, 5, 1, 0.0, 300.0) == 5


def test_policy_parses_the_flag_and_refuses_bad_values():
    p = parse_policy("metric=kv,target=0.7,min=2,max=6,scale_down_window=60")
    assert (p.metric, p.target, p.min, p.max, p.scale_down_window_s) == ("kv", 0.7, 2, 6, 60)
    assert parse_policy({}).scale_down_window_s == 300  # the HPA default
    assert parse_policy({}).sync_period_s == 15
    for bad in ("metric=cpu", "target=0", "min=3,max=2", "speed=1", "target=fast", "min"):
        with pytest.raises(ValueError):
            parse_policy(bad)


def test_scales_out_during_the_ramp_and_back_in_after_it(ramp_run):
    sr, rep = ramp_run
    events = rep["autoscaling"]["a100"]["events"]
    ups = [e for e in events if e["to"] > e["from"]]
    downs = [e for e in events if e["to"] < e["from"]]
    assert ups and 20 <= ups[0]["t"] <= 40  # during the ramp, not before it
    assert max(e["to"] for e in events) == POLICY.max
    assert downs and downs[-1]["to"] == POLICY.min
    # scale-in comes after the plateau, once the stabilisation window has passed since the
    # queue was last long enough to ask for more than one replica
    rows = rep["timeline"]
    busy = max(r["t"] for r in rows if r["ready"] and r["waiting"] / r["ready"] > POLICY.target)
    first_down = min(e["t"] for e in downs)
    assert first_down >= max(80, busy + POLICY.scale_down_window_s)
    assert first_down <= 80 + POLICY.scale_down_window_s + 2 * POLICY.sync_period_s
    provisioned = [r["provisioned"] for r in rep["timeline"]]
    assert provisioned[0] == 1 and max(provisioned) == 3
    # every request was served, by more than one replica
    assert all(r.error is None for r in sr.cluster.run.records)
    assert len({r.replica for r in sr.cluster.run.records}) >= 3


def test_cold_start_dip_on_the_emulated_timeline(ramp_run):
    _, rep = ramp_run
    rows = rep["timeline"]
    first_up = next(e for e in rep["autoscaling"]["a100"]["events"] if e["to"] > e["from"])
    ready_at = first_up["t"] + POLICY.boot_s
    booting = [r for r in rows if first_up["t"] <= r["t"] < ready_at]
    assert booting and all(r["ready"] < r["provisioned"] for r in booting)
    # requests arriving while the new replica boots wait behind the old one; once every
    # replica is ready (before the traffic drops at 80 s) the queue is gone again
    settled = [r for r in rows if 65 <= r["t"] < 80 and r["ready"] == POLICY.max]
    assert settled
    worst_boot = max(r["ttft_p99_s"] for r in booting if r["ttft_p99_s"] is not None)
    assert worst_boot > 3 * max(r["ttft_p99_s"] for r in settled)
    assert max(r["waiting"] for r in booting) > max(r["waiting"] for r in settled)


def test_billed_only_while_provisioned(ramp_run):
    sr, rep = ramp_run
    a = rep["autoscaling"]["a100"]
    core = sr.cluster.replicas[0].core
    duration = sr.cluster.run.duration_s
    # more than one replica for the whole run, fewer than max for the whole run
    assert duration < a["replica_seconds"] < POLICY.max * duration
    dollars = sum(r.core.stats.dollars for r in sr.cluster.replicas)
    # at least idle price for every billed second, never more than busy price
    assert dollars >= a["replica_seconds"] * core.dollars_per_s * 0.999
    never = [k for k, s in enumerate(sr.control.billed_s) if s == 0]
    assert never and all(sr.cluster.replicas[k].core.stats.joules == 0 for k in never)


def test_a_new_replica_pays_the_device_models_cold_start():
    """JetStream compiles its buckets ahead of time: a new replica's boot is that compile
    plus the weights' load (devices/compile.py), and it takes traffic only afterwards."""
    v6e = EngineOptions(name="v6e", model="llama-3.1-8b", quant="bf16", chip="tpu-v6e",
                        engine="jetstream", max_model_len=2048, max_num_seqs=4)
    expected = build_core(dataclasses.replace(v6e, start="cold")).compiler.startup_seconds(True)
    assert expected > 60  # a real compile, not just the weights
    policy = AutoscalePolicy(metric="waiting", target=2, min=1, max=2, sync_period_s=5)
    work = sessions(rate_shape="piecewise:0=6,10=6,10.5=0.1,400=0.1", osl=32)
    sr = run_scaled([v6e], [policy], work, "least-requests")
    up = sr.groups[0].events[0]
    assert up["to"] == 2 and sr.groups[0].boot_s == pytest.approx(expected)
    second = [r for r in sr.cluster.run.records if r.replica == 1]
    assert second and min(r.scheduled_s for r in second) >= up["t"] + expected


def test_simulate_autoscale_flag_json_and_html(tmp_path, capsys):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[deployments]]\nname = "a100"\nmodel = "llama-2-13b"\nquant = "bf16"\n'
                     'chip = "a100-sxm-80g"\nengine = "vllm"\nmax_model_len = 2048\n'
                     'max_num_seqs = 4\n\n[deployments.autoscaling]\nmetric = "waiting"\n'
                     'target = 2\nmax = 3\nsync_period_s = 5\nscale_down_window_s = 20\n'
                     'boot_s = 20\n')
    html = tmp_path / "report.html"
    assert main(["simulate", "--config", str(fleet), "--isl", "64", "--osl", "96",
                 "--ignore-eos", "--seed", "3", "--rate-shape", RAMP, "--json",
                 "--html", str(html)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["autoscaling"]["a100"]["policy"]["max"] == 3
    assert max(r["provisioned"] for r in summary["timeline"]) == 3
    assert {"t", "ready", "waiting", "running", "kv_usage", "ttft_p99_s", "dollars"} <= set(
        summary["timeline"][0])
    text = html.read_text()
    assert "data:image/png;base64," in text and 'id="timeline"' in text
    assert "replica-seconds billed" in text  # the terminal's conclusion, in the page
    # the same run in the terminal prints the table
    assert main(["simulate", "--config", str(fleet), "--isl", "64", "--osl", "96",
                 "--ignore-eos", "--seed", "3", "--rate-shape", "ramp:from=1,to=5,over=20",
                 "--duration", "40",
                 "--autoscale", "metric=waiting,target=2,max=2,boot_s=20,sync_period_s=5"]) == 0
    out = capsys.readouterr().out
    assert "replicas 1..2" in out and "ttft p99" in out


def test_bad_autoscaling_is_a_clear_error(tmp_path, capsys):
    code = main(["simulate", "--chip", "a100-sxm-80g", "--engine", "vllm", "--model",
                 "llama-2-13b", "--quant", "bf16", "--autoscale", "metric=cpu",
                 "--num-requests", "4"])
    assert code == 2
    assert "metric" in capsys.readouterr().err


def test_timeline_of_a_fixed_deployment(capsys):
    """--timeline without an autoscaler: one replica throughout, arrivals counted per
    interval, dollars growing; no scaling line in the terminal."""
    base = ["simulate", "--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b",
            "--quant", "bf16", "--isl", "32", "--osl", "8", "--ignore-eos", "--seed", "2",
            "--rate-shape", "burst:low=1,high=20,on=5,off=10", "--duration", "30",
            "--timeline", "5"]
    assert main([*base, "--json"]) == 0
    s = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = s["timeline"]
    assert [r["t"] for r in rows] == [0, 5, 10, 15, 20, 25, 30][: len(rows)] and len(rows) >= 6
    assert {r["provisioned"] for r in rows} == {r["ready"] for r in rows} == {1}
    assert all(a["policy"] is None and not a["events"] for a in s["autoscaling"].values())
    assert sum(r["arrivals"] for r in rows) == s["requests"]
    busy = [r["arrivals"] for r in rows[:6]]
    assert busy[2] > 3 * busy[0] and busy[5] > 3 * busy[3]  # the bursts at 10-15, 25-30 s
    assert all(a["dollars"] < b["dollars"] for a, b in itertools.pairwise(rows))
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "timeline" in out and "autoscaling" not in out


def test_fleet_file_autoscaling_table_is_checked(tmp_path, capsys):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[deployments]]\nname = "a"\nmodel = "llama-3.1-8b"\nquant = "bf16"\n'
                     'chip = "h100-sxm"\nengine = "vllm"\n\n[deployments.autoscaling]\n'
                     'metric = "waiting"\nmax = 0\n')
    assert main(["simulate", "--config", str(fleet), "--num-requests", "2"]) == 2
    assert "min <= max" in capsys.readouterr().err
    fleet.write_text(fleet.read_text().replace("max = 0", "max = [1]"))
    assert main(["simulate", "--config", str(fleet), "--num-requests", "2"]) == 2
    assert "autoscaling values" in capsys.readouterr().err


def test_scaled_in_replicas_drain_then_stop_being_billed(ramp_run):
    """The two replicas added during the ramp: billed from their scale-up event (the boot
    included) until the last request they hold ends, and routed nothing after scale-in."""
    sr, rep = ramp_run
    events = rep["autoscaling"]["a100"]["events"]
    ups = [e for e in events if e["to"] > e["from"]]
    down = next(e for e in events if e["to"] < e["from"])
    booted = {}
    for e in ups:  # slots boot lowest first, one per replica added
        for k in range(e["from"], e["to"]):
            booted[k] = e["t"]
    assert sorted(booted) == [1, 2]
    for k, t_boot in booted.items():
        mine = [r for r in sr.cluster.run.records if r.replica == k]
        assert mine and min(r.scheduled_s for r in mine) >= t_boot + POLICY.boot_s
        assert max(r.scheduled_s for r in mine) < down["t"]  # none routed once draining
        drained = max(down["t"], max(r.end_s for r in mine))
        assert sr.control.billed_s[k] == pytest.approx(drained - t_boot)


def test_slo_classes_route_to_their_pools_and_wake_only_theirs():
    """`--router slo-class` over autoscaled pools: a request goes to the ready replicas of the
    pools serving its class, held while they are at zero; the held requests of one class
    wake only the pools that serve it (KEDA's activation counts what each would serve)."""
    policy = dataclasses.replace(TO_ZERO, cooldown_s=30)
    a = dataclasses.replace(A100, name="a", slo_classes=("a",))
    b = dataclasses.replace(A100, name="b", slo_classes=("b",))

    def burst(cls: str, at: float, n: int) -> list:
        return [dataclasses.replace(c, start_s=c.start_s + at,
                                    conversation_id=f"{cls}{at:g}-{c.conversation_id}")
                for c in sessions(num_requests=n, rate=1.0, slo_class_mix=((cls, 1.0),))]
    # both classes for the first seconds; after both pools went to zero, class a alone
    work = sorted(burst("a", 0, 5) + burst("b", 0, 5) + burst("a", 150, 5),
                  key=lambda c: c.start_s)
    sr = run_scaled([a, b], [policy, policy], work, "slo-class")
    records = sr.cluster.run.records
    assert len(records) == len(work) and all(r.ok for r in records)
    group = {k: g.name for g in sr.groups for k in g.slots}
    assert all(group[r.replica] == r.slo_class for r in records)  # its own pools only
    events = report(sr)["autoscaling"]
    for name in ("a", "b"):
        assert any(e["to"] == 0 and e["t"] < 150 for e in events[name]["events"])
    assert any(e["from"] == 0 and e["t"] >= 150 for e in events["a"]["events"])
    assert not any(e["from"] == 0 for e in events["b"]["events"])  # class a's did not wake b
    late = [r for r in records if r.scheduled_s >= 150]
    assert min(r.ttft for r in late) >= 20  # held through a's cold start


def _outstanding_peak(records, k: int) -> int:
    """The most requests replica k held at once (routed to it, not yet ended)."""
    edges = sorted([(r.scheduled_s, 1) for r in records if r.replica == k]
                   + [(r.end_s, -1) for r in records if r.replica == k],
                   key=lambda e: (e[0], e[1]))  # an end before an arrival at one instant
    return max(itertools.accumulate(d for _, d in edges), default=0)


def test_admission_sheds_over_the_ready_replicas_of_an_autoscaled_pool():
    """GIE's breaker in front of an autoscaled pool: a request no ready replica has room for
    is refused (RESOURCE_EXHAUSTED, on no replica), no replica ever holds more than the
    limit, and the pool still scales on what its replicas run. On the queue metric the same
    limit hides the load: max-outstanding = max_num_seqs leaves nothing waiting, so the
    pool never grows and sheds more (what a planner combining the two must see)."""
    limit = Admission(max_outstanding=4)
    by_running = dataclasses.replace(POLICY, metric="running", target=3)
    runs = {}
    for policy in (by_running, POLICY):
        work = sessions(rate_shape=RAMP)
        sr = run_scaled([A100], [policy], work, "least-requests", admission=limit)
        records = sr.cluster.run.records
        assert len(records) == len(work)
        shed = [r for r in records if r.error]
        assert {r.error for r in shed} == {"RESOURCE_EXHAUSTED"}
        assert all(r.replica == -1 for r in shed) and len(shed) == sr.control.refused
        for k, replica in enumerate(sr.cluster.replicas):
            assert _outstanding_peak(records, k) <= 4
            assert not replica.core.has_unfinished()
            replica.core.scheduler.check_integrity()
        runs[policy.metric] = (sr, report(sr)["autoscaling"]["a100"]["events"])
    sr, events = runs["running"]
    assert sr.control.refused > 0 and max(e["to"] for e in events) > 1
    queue_sr, queue_events = runs["waiting"]
    assert not any(e["to"] > e["from"] for e in queue_events)
    assert queue_sr.control.refused > sr.control.refused
    unlimited = run_scaled([A100], [by_running], sessions(rate_shape=RAMP), "least-requests")
    assert unlimited.control.refused == 0
    assert all(r.ok for r in unlimited.cluster.run.records)


def test_simulate_autoscale_with_admission_reports_what_it_shed(capsys):
    code = main(["simulate", "--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-2-7b",
                 "--quant", "bf16", "--num-requests", "60", "--rate", "40", "--isl", "64",
                 "--osl", "64", "--autoscale", "metric=running,target=4,min=1,max=2",
                 "--admission", "max-outstanding=4", "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["admission_refused"] > 0
    assert summary["errors"] == {"RESOURCE_EXHAUSTED": summary["admission_refused"]}


def test_autoscaled_run_is_the_same_macro_or_single_stepped(monkeypatch):
    """The autoscaler reads every replica's queue and KV at its ticks: macro windows end at
    the next tick, so scaling decisions and every request's tokens are those of
    single-stepping."""
    import sim.virtual as virtual
    import sim.virtual_macro as virtual_macro

    runs = []
    for macro in (False, True):
        monkeypatch.setitem(virtual.MACRO_STEPS, "default", macro)
        calls = []
        real = virtual_macro.advance
        monkeypatch.setattr(virtual_macro, "advance",
                            lambda *a, _real=real, _calls=calls, **k: _calls.append(1)
                            or _real(*a, **k))
        sr = run_scaled([A100], [POLICY], sessions(rate_shape=RAMP, ignore_eos=False),
                        "least-requests")
        monkeypatch.setattr(virtual_macro, "advance", real)
        recs = sorted(sr.cluster.run.records, key=lambda r: r.request_id)
        runs.append((recs, (report(sr)["autoscaling"]["a100"]["events"], sr.control.samples),
                     len(calls), sr.cluster.run.duration_s))
    (single, scale1, n1, d1), (macro, scale2, n2, d2) = runs
    assert n1 == 0 and n2 > 0  # windows were really tried in the second run
    assert len(scale1[1]) == len(scale2[1])  # what the autoscaler read at every tick
    for a, b in zip(scale1[1], scale2[1], strict=True):
        assert a.keys() == b.keys()
        assert all(b[k] == pytest.approx(v, rel=1e-9) for k, v in a.items()), (a, b)
    assert scale1[0] == scale2[0] and len(scale1[0]) >= 2  # and its decisions
    assert d1 == pytest.approx(d2, rel=1e-9)
    assert [(r.request_id, r.replica, r.output_tokens) for r in single] == \
        [(r.request_id, r.replica, r.output_tokens) for r in macro]
    for a, b in zip(single, macro, strict=True):
        assert a.token_times == pytest.approx(b.token_times, rel=1e-9)


# --- scale to zero (KEDA: minReplicaCount 0, cooldownPeriod, activation threshold) ---
GAP = "piecewise:0=1,20=1,20.5=0,200=0,200.5=1,230=1"  # 1 req/s, 180 s of nothing, 1 req/s
TO_ZERO = dataclasses.replace(POLICY, metric="running", target=2, min=0, cooldown_s=60)


def test_a_pool_scales_to_zero_in_a_quiet_spell_and_wakes_for_the_next_request():
    work = sessions(rate_shape=GAP)
    sr = run_scaled([A100], [TO_ZERO], work, "least-requests")
    rep = report(sr)
    events = rep["autoscaling"]["a100"]["events"]
    records = sr.cluster.run.records
    assert len(records) == len(work) and all(r.ok for r in records)  # none lost while held
    last_busy = max(r.end_s for r in records if r.scheduled_s < 100)
    to_zero = [e for e in events if e["to"] == 0]
    # the cooldown after the last sync that saw a request running (syncs every 5 s)
    assert to_zero and last_busy + 60 - 5 <= to_zero[0]["t"] <= last_busy + 60 + 5
    wake = [e for e in events if e["from"] == 0 and e["to"] == 1]
    assert wake and 200 <= wake[0]["t"] <= 206  # the first sync with a request held
    first = min((r for r in records if r.scheduled_s >= 200), key=lambda r: r.scheduled_s)
    # held at the router from its arrival through the wake-up and the 20-s cold start
    assert wake[0]["t"] + 20 <= first.scheduled_s + first.ttft <= wake[0]["t"] + 21
    assert first.ttft >= 20
    at_one = run_scaled([A100], [dataclasses.replace(TO_ZERO, min=1)], sessions(rate_shape=GAP),
                        "least-requests")
    zero_s = rep["autoscaling"]["a100"]["replica_seconds"]
    one_s = report(at_one)["autoscaling"]["a100"]["replica_seconds"]
    assert zero_s < one_s - 100  # ~2 minutes at zero are not billed
    again = min((r for r in at_one.cluster.run.records if r.scheduled_s >= 200),
                key=lambda r: r.scheduled_s)
    assert again.ttft < 1  # kept warm at one replica: no wait


def test_requests_a_pool_at_zero_will_not_wake_for_end_unavailable():
    policy = dataclasses.replace(TO_ZERO, cooldown_s=0, activation=1000)  # never wakes
    work = sessions(num_requests=5, rate=1.0)
    sr = run_scaled([A100], [policy], work, "least-requests")
    records = sr.cluster.run.records
    assert len(records) == 5
    zeroed = [e for e in report(sr)["autoscaling"]["a100"]["events"] if e["to"] == 0]
    assert zeroed and zeroed[0]["t"] == 0  # inactive from the start, no cooldown
    assert {r.error for r in records} == {"UNAVAILABLE"} and all(r.replica == -1
                                                                for r in records)
    for r in sr.cluster.replicas:  # nothing was left on any replica
        assert not r.core.has_unfinished()
        r.core.scheduler.check_integrity()


def test_held_requests_time_out_after_the_readiness_timeout():
    """KEDA's HTTP add-on answers 504 when a request waited its readiness timeout for a
    replica: the requests held through the 20-s cold start for longer than 10 s end
    DEADLINE_EXCEEDED at their deadline, on no replica, the later ones are served."""
    policy = dataclasses.replace(TO_ZERO, readiness_timeout_s=10)
    work = sessions(rate_shape=GAP)
    sr = run_scaled([A100], [policy], work, "least-requests")
    records = sr.cluster.run.records
    assert len(records) == len(work)
    late = [r for r in records if r.scheduled_s >= 200]
    timed_out = [r for r in late if not r.ok]
    assert timed_out and {r.error for r in timed_out} == {"DEADLINE_EXCEEDED"}
    for r in timed_out:
        assert r.replica == -1 and r.end_s - r.scheduled_s == pytest.approx(10)
    served = [r for r in late if r.ok]
    assert served and max(r.ttft for r in served) < 11  # held < 10 s, then prefilled
    assert min(r.scheduled_s for r in served) > max(r.scheduled_s for r in timed_out)
    assert all(r.ok for r in records if r.scheduled_s < 200)  # the pool was up then
    for r in sr.cluster.replicas:
        assert not r.core.has_unfinished()
        r.core.scheduler.check_integrity()


def test_scale_to_zero_takes_keda_names_and_refuses_bad_bounds():
    p = parse_policy("minReplicaCount=0,maxReplicaCount=4,cooldownPeriod=120,"
                     "activationThreshold=2,pollingInterval=30")
    assert (p.min, p.max, p.cooldown_s, p.activation, p.sync_period_s) == (0, 4, 120, 2, 30)
    assert parse_policy("min=0,readinessTimeout=15").readiness_timeout_s == 15
    for bad in ("min=0,max=0", "min=-1", "cooldown=-5", "activation=-1", "readiness=-1"):
        with pytest.raises(ValueError):
            parse_policy(bad)
