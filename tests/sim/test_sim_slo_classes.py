"""SLO classes (issue 16): a request's class comes from a trace line or a seeded weighted
mix, travels to every record and summary, and `--router slo-class` sends each class to the
pools listing it — interactive on an SRAM chip beats what round robin gives the same requests."""

from __future__ import annotations

import json

import pytest
from fleet_helpers import H100, SRAM, pool, run, sessions

from clients.report import summarize
from clients.workloads import WorkloadSpec, build_workload
from doppelchip.cli import main
from sim.pools import FleetError
from sim.reports import class_reports, pool_reports

MIX = (("interactive", 0.3), ("batch", 0.7))
WORK = dict(kind="random", num_requests=60, isl=512, osl=32, rate=20.0, slo_class_mix=MIX)
FLEET = [pool(SRAM, "sram", slo_classes=("interactive",)),
         pool(H100, "gpu", replicas=2, slo_classes=("batch",))]


def test_the_class_mix_is_seeded_and_changes_nothing_else():
    plain = build_workload(WorkloadSpec(num_requests=200, rate=10.0, seed=4))
    mixed = build_workload(WorkloadSpec(num_requests=200, rate=10.0, seed=4, slo_class_mix=MIX))
    again = build_workload(WorkloadSpec(num_requests=200, rate=10.0, seed=4, slo_class_mix=MIX))
    other = build_workload(WorkloadSpec(num_requests=200, rate=10.0, seed=5, slo_class_mix=MIX))
    assert [c.slo_class for c in plain] == [""] * 200
    assert [(c.turns, c.start_s) for c in mixed] == [(c.turns, c.start_s) for c in plain]
    assert [c.slo_class for c in mixed] == [c.slo_class for c in again]
    assert [c.slo_class for c in mixed] != [c.slo_class for c in other]
    share = sum(c.slo_class == "interactive" for c in mixed) / 200
    assert 0.2 < share < 0.4  # the weights, within sampling error of 200 draws
    with pytest.raises(ValueError, match="weights"):
        build_workload(WorkloadSpec(num_requests=5, slo_class_mix=(("a", 0.0),)))


def test_a_trace_line_carries_its_class(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 8, "max_tokens": 2, '
                     '"slo_class": "interactive"}\n'
                     '{"timestamp": 1, "input_length": 8, "max_tokens": 2}\n')
    convs = build_workload(WorkloadSpec(kind="trace", trace_path=str(trace),
                                        slo_class_mix=(("batch", 1.0),)))
    assert [c.slo_class for c in convs] == ["interactive", "batch"]  # the line's own kept
    trace.write_text('{"timestamp": 0, "input_length": 8, "max_tokens": 2, "slo_class": 3}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:1: slo_class must be a string"):
        build_workload(WorkloadSpec(kind="trace", trace_path=str(trace)))


def interactive_ttft_p99(results) -> float:
    return summarize([r for r in results if r.slo_class == "interactive"])["ttft_s"]["p99"]


def test_slo_class_routes_each_class_to_its_pool_and_beats_round_robin():
    work = sessions(**WORK)
    cr, results, s = run(FLEET, "slo-class", work)
    assert s["requests"] == 60 and not s["errors"]
    by_class = {r.slo_class for r in cr.run.records}
    assert by_class == {"interactive", "batch"}
    for rec in cr.run.records:  # replica 0 is the SRAM chip, 1 and 2 the GPUs
        assert (rec.replica == 0) == (rec.slo_class == "interactive")
    pools = {p["name"]: p for p in pool_reports(cr.dispatch.pools, cr.dispatch.cores,
                                                results)}
    n_inter = sum(r.slo_class == "interactive" for r in results)
    assert pools["sram"]["requests"] == n_inter and pools["sram"]["classes"] == ["interactive"]
    assert pools["gpu"]["requests"] == 60 - n_inter and pools["gpu"]["replicas"] == 2
    assert class_reports(results)["interactive"]["requests"] == n_inter
    _, rr_results, _ = run(FLEET, "round-robin", work)
    assert {r.request_id for r in rr_results} == {r.request_id for r in results}
    assert interactive_ttft_p99(results) < interactive_ttft_p99(rr_results)


def test_a_class_no_pool_serves_is_an_error_before_the_run():
    work = sessions(**{**WORK, "num_requests": 8, "slo_class_mix": (("other", 1.0),)})
    with pytest.raises(FleetError, match="SLO class 'other': no pool serves it"):
        run(FLEET, "slo-class", work)
    with pytest.raises(FleetError, match="untagged requests"):
        run(FLEET, "slo-class", sessions(kind="random", num_requests=4))
    # a pool without slo_classes serves any class
    cr, _, s = run([FLEET[0], pool(H100, "any")], "slo-class", work)
    assert s["requests"] == 8 and {r.replica for r in cr.run.records} == {1}


SLO_TOML = """
[[deployments]]
name = "sram"
model = "llama-3.1-8b"
quant = "bf16"
chip = "cerebras-cs3"
engine = "cerebras"
max_model_len = 2048
slo_classes = ["interactive"]

[[deployments]]
name = "gpu"
model = "llama-3.1-8b"
quant = "bf16"
chip = "h100-sxm"
engine = "vllm"
max_model_len = 2048
slo_classes = ["batch"]
"""
ARGS = ["--num-requests", "20", "--isl", "64", "--osl", "8", "--rate", "20", "--seed", "2",
        "--slo-class-mix", "interactive=1,batch=1"]


def test_the_command_reports_pools_and_classes(tmp_path, capsys):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(SLO_TOML)
    assert main(["simulate", "--config", str(fleet), "--router", "slo-class", *ARGS,
                 "--json"]) == 0
    s = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert [(p["name"], p["role"], p["classes"]) for p in s["pools"]] == [
        ("sram", "both", ["interactive"]), ("gpu", "both", ["batch"])]
    assert {k: v["requests"] for k, v in s["classes"].items()} == {
        "batch": s["pools"][1]["requests"], "interactive": s["pools"][0]["requests"]}
    assert s["pools"][0]["usd_per_hour"] > 0 and "p99" in s["pools"][0]["ttft_s"]
    assert main(["simulate", "--config", str(fleet), "--router", "slo-class", *ARGS]) == 0
    out = capsys.readouterr().out
    assert "pools" in out and "interactive" in out and "classes" in out
    bad = [*ARGS[:-1], "interactive=1,bulk=1"]
    assert main(["simulate", "--config", str(fleet), "--router", "slo-class", *bad]) == 2
    assert "SLO class 'bulk': no pool serves it" in capsys.readouterr().err
    fleet.write_text(SLO_TOML.replace('slo_classes = ["batch"]', 'slo_classes = "batch"'))
    assert main(["simulate", "--config", str(fleet), "--router", "slo-class", *ARGS]) == 2
    assert "slo_classes must be a list of names" in capsys.readouterr().err
