"""The P/D serving mode as the plan's extension point: its fleet file is the fleet-file P/D
syntax (a prefill and a decode pool, `role`), and the search walks two replica counts to the
cheapest pair. The simulation is a stand-in here (a function of the two counts, so the test
knows the answer); the real P/D fleet's simulation is tests/sim/test_sim_pd_pools.py's."""

from __future__ import annotations

import tomllib

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
