"""The P/D serving mode as the plan's extension point: its fleet file is the fleet-file P/D
syntax (a prefill and a decode pool, `role`), and the search walks two replica counts to the
cheapest pair. The simulation is a stand-in here (a function of the two counts, so the test
knows the answer); the real P/D fleet's simulation is tests/sim/test_sim_pd_pools.py's."""

from __future__ import annotations

import tomllib

import pytest

from clients.workloads import WorkloadSpec
from sim.plan import PlanInputs, search
from sim.plan_exec import PoolExecutor
from sim.plan_fleet import fleet_text
from sim.plan_slo import parse_plan_slo
from sim.plan_space import PD_AVAILABLE, Config, SearchSpace


def fake_pd(argv: list[str]) -> dict:
    """TTFT falls with prefill replicas, TPOT with decode replicas."""
    with open(argv[argv.index("--config") + 1], "rb") as f:
        pools = {d["role"]: d["replicas"] for d in tomllib.load(f)["deployments"]}
    def stat(v: float) -> dict:
        return {"mean": v, "p50": v, "p90": v, "p95": v, "p99": v}
    return {"errors": {}, "ttft_s": stat(0.3 / pools["prefill"]),
            "tpot_s": stat(0.06 / pools["decode"]), "itl_s": stat(0.01), "e2e_s": stat(1.0),
            "usd_per_mtok": 1.0, "requests_per_s": 1.0, "output_tokens_per_s": 1.0}


def test_pd_fleet_file():
    text = fleet_text(Config("h100-sxm", "vllm", "bf16", "llama-3.1-8b", mode="pd"), (2, 3))
    pools = tomllib.loads(text)["deployments"]
    assert [(p["role"], p["replicas"]) for p in pools] == [("prefill", 2), ("decode", 3)]
    assert {p["chip"] for p in pools} == {"h100-sxm"}


def test_pd_search_finds_the_cheapest_pair():
    space = SearchSpace(model="llama-3.1-8b", chips=("h100-sxm",), engines=("vllm",),
                        quants=("bf16",), tps=(1,), modes=("pd",), max_replicas=8)
    inputs = PlanInputs(space, WorkloadSpec(isl=128, osl=32, rate=1.0, ignore_eos=True),
                        [], parse_plan_slo("ttft_p99=0.16,tpot_p99=0.021"), runners_up=0)
    plan = search(inputs, PoolExecutor(1), fake_pd)
    w = plan["winner"]
    assert w["pools"] == {"prefill": 2, "decode": 3} and w["replicas"] == 5
    # every cheaper pair was tried and missed
    tried = {(r["pools"]["prefill"], r["pools"]["decode"]): r["meets_slo"]
             for r in plan["candidates"]}
    assert all(not ok for (p, d), ok in tried.items() if p + d < 5)
    assert (1, 1) in tried and (2, 2) in tried


def test_pd_is_offered_only_when_the_fleet_file_has_roles(capsys):
    from doppelchip.cli import main

    rc = main(["plan", "--chips", "h100-sxm", "--engines", "vllm", "--quants", "bf16",
               "--rate", "1", "--slo", "ttft=1", "--modes", "pd"])
    if PD_AVAILABLE:
        assert rc in (0, 1)
    else:
        assert rc == 2 and "P/D pools need" in capsys.readouterr().err


def test_pd_winner_as_kubernetes_manifests():
    """`--write-k8s` of a P/D winner: a Deployment + Service per pool, each of its pool's
    replica count, labelled with llm-d's role label (what the endpoint picker's prefill and
    decode filters select on) and taking the NIXL connector, valid against the Kubernetes
    schemas and a command line `doppelchip serve` accepts."""
    import importlib.util
    from pathlib import Path

    from doppelchip.cli import build_parser
    from server.engine.kv_transfer import KvTransferConfig
    from sim.plan_deploy import ROLE_LABEL, manifests

    space = SearchSpace(model="llama-3.1-8b", chips=("h100-sxm",), engines=("vllm",),
                        quants=("bf16",), tps=(1,), modes=("pd",), max_replicas=8)
    inputs = PlanInputs(space, WorkloadSpec(isl=128, osl=32, rate=1.0, ignore_eos=True),
                        [], parse_plan_slo("ttft_p99=0.16,tpot_p99=0.021"), runners_up=0)
    w = search(inputs, PoolExecutor(1), fake_pd)["winner"]
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "k8s_validation", root / "tests" / "deploy" / "k8s_validation.py")
    v = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(v)
    import yaml

    files = manifests(w)
    assert sorted(files) == sorted([f"{w['deployment']}-prefill.yaml",
                                    f"{w['deployment']}-decode.yaml", "kustomization.yaml"])
    serve = build_parser()
    for role, replicas in w["pools"].items():
        docs = list(yaml.safe_load_all(files[f"{w['deployment']}-{role}.yaml"]))
        assert [d["kind"] for d in docs] == ["Deployment", "Service"]
        assert all(v.errors_of(d) == [] for d in docs)
        deployment = docs[0]
        assert deployment["spec"]["replicas"] == replicas
        template = deployment["spec"]["template"]
        assert template["metadata"]["labels"][ROLE_LABEL] == role
        c = template["spec"]["containers"][0]
        config = c["args"][c["args"].index("--kv-transfer-config") + 1]
        assert KvTransferConfig.parse(config) is not None
        serve.parse_args([*c["command"][1:], *c["args"]])  # exits (fails) if refused
        assert docs[1]["spec"]["selector"] == {"app": deployment["metadata"]["name"]}
    assert {d["spec"]["selector"]["app"] for f, t in files.items() if f != "kustomization.yaml"
            for d in yaml.safe_load_all(t) if d["kind"] == "Service"} == {
        f"doppelchip-plan-{w['deployment']}-prefill", f"doppelchip-plan-{w['deployment']}-decode"}


def fake_shapes(argv: list[str]) -> dict:
    """TTFT falls with prefill replicas and is 2.5 × longer on an A100 than on an H100;
    TPOT falls with decode replicas on either chip."""
    with open(argv[argv.index("--config") + 1], "rb") as f:
        pools = {d["role"]: (d["chip"], d["replicas"]) for d in tomllib.load(f)["deployments"]}
    (pchip, p), (_, d) = pools["prefill"], pools["decode"]
    ttft = (0.1 if pchip == "h100-sxm" else 0.25) / p

    def stat(v: float) -> dict:
        return {"mean": v, "p50": v, "p90": v, "p95": v, "p99": v}
    return {"errors": {}, "ttft_s": stat(ttft), "tpot_s": stat(0.04 / d), "itl_s": stat(0.01),
            "e2e_s": stat(1.0), "usd_per_mtok": 1.0, "requests_per_s": 1.0,
            "output_tokens_per_s": 1.0}


def test_pd_pools_of_two_shapes_win_when_cheapest():
    """Splitwise's point, found by the search: prefill where it is fast, decode where it is
    cheap. Here an H100 prefills within the TTFT bound alone, an A100 needs three, and decode
    needs two replicas of either; the search must return the cheapest of every (prefill chip,
    decode chip, counts) fleet — H100 prefill with A100 decode — brute-forced here."""
    import itertools

    space = SearchSpace(model="llama-3.1-8b", chips=("h100-sxm", "a100-sxm-80g"),
                        engines=("vllm",), quants=("bf16",), tps=(1,), modes=("pd",),
                        max_replicas=8)
    slo = parse_plan_slo("ttft_p99=0.11,tpot_p99=0.021")
    inputs = PlanInputs(space, WorkloadSpec(isl=128, osl=32, rate=1.0, ignore_eos=True), [],
                        slo, runners_up=1)
    plan = search(inputs, PoolExecutor(1), fake_shapes)
    price = {c["deployment"]: c["usd_per_replica_hour"] for c in plan["configs"]}
    chip_of = {name: ("h100-sxm" if "h100" in name else "a100-sxm-80g") for name in price}
    best = min((price[a] * p + price[b] * d, a, b, p, d)
               for a, b in itertools.product(price, repeat=2)
               for p, d in itertools.product(range(1, 5), repeat=2)
               if (0.1 if chip_of[a] == "h100-sxm" else 0.25) / p <= 0.11 and 0.04 / d <= 0.021)
    w = plan["winner"]
    assert w["usd_per_hour"] == pytest.approx(best[0])
    assert (w["pool_shapes"]["prefill"]["chip"], w["pool_shapes"]["decode"]["chip"]) == \
        ("h100-sxm", "a100-sxm-80g")
    assert w["pools"] == {"prefill": 1, "decode": 2} and w["chip"] == "h100-sxm+a100-sxm-80g"
    fleet = tomllib.loads(w["fleet"])["deployments"]
    assert [(d["role"], d["chip"], d["replicas"]) for d in fleet] == [
        ("prefill", "h100-sxm", 1), ("decode", "a100-sxm-80g", 2)]
    # all four pairings were searched, and every cheaper candidate was simulated and missed
    shapes = {(r["pool_shapes"]["prefill"]["chip"], r["pool_shapes"]["decode"]["chip"])
              for r in plan["candidates"]}
    assert shapes == set(itertools.product(("h100-sxm", "a100-sxm-80g"), repeat=2))
    assert all(not r["meets_slo"] for r in plan["candidates"]
               if r["usd_per_hour"] < w["usd_per_hour"])


def test_units_pair_pd_shapes_within_an_engine_model_and_quant():
    from sim.plan_space import Sized
    from sim.plan_units import units

    def sized(chip: str, engine: str, mode: str) -> Sized:
        return Sized(Config(chip, engine, "bf16", "llama-3.1-8b", mode=mode), 1.0, 1, 1,
                     1.0, 1.0, 1)
    kept = [sized("h100-sxm", "vllm", "pd"), sized("a100-sxm-80g", "vllm", "pd"),
            sized("h100-sxm", "sglang", "pd"), sized("h100-sxm", "vllm", "aggregated")]
    pairs = [(u.mode, tuple((c.chip, c.engine) for c in u.configs)) for u in units(kept)]
    assert sorted(pairs) == sorted([
        ("pd", (("h100-sxm", "vllm"), ("h100-sxm", "vllm"))),
        ("pd", (("h100-sxm", "vllm"), ("a100-sxm-80g", "vllm"))),
        ("pd", (("a100-sxm-80g", "vllm"), ("h100-sxm", "vllm"))),
        ("pd", (("a100-sxm-80g", "vllm"), ("a100-sxm-80g", "vllm"))),
        ("pd", (("h100-sxm", "sglang"), ("h100-sxm", "sglang"))),
        ("aggregated", (("h100-sxm", "vllm"),))])


def test_a_fleet_of_two_pd_shapes_simulates_on_both_chips():
    """The fleet file a two-shape candidate is written as runs: prefill on the H100 pool,
    decode on the A100 pool, every request's KV crossing the link."""
    from doppelchip.cmd_plan import run_simulate
    from sim.plan_exec import Task, run_task
    from sim.plan_fleet import simulate_argv

    pre = Config("h100-sxm", "vllm", "bf16", "llama-3.1-8b", mode="pd")
    dec = Config("a100-sxm-80g", "vllm", "bf16", "llama-3.1-8b", mode="pd")
    argv = simulate_argv("least-requests", ["--isl", "256", "--osl", "16", "--ignore-eos",
                                            "--num-requests", "12", "--rate", "4"], "")
    out = run_task(run_simulate, Task(fleet_text((pre, dec), (1, 2)), argv))
    s = out["summary"]
    assert s["errors"] == {} and s["requests"] == 12
    assert s["kv_transfers"]["count"] == 12
    chips = {r["name"]: (r["chip"], r["requests"], r.get("prefills")) for r in s["replicas"]}
    assert chips["vllm-h100-sxm-bf16-tp1-pd-prefill"] == ("h100-sxm", 0, 12)
    assert sum(n for c, n, _ in chips.values() if c == "a100-sxm-80g") == 12
