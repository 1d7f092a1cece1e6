"""At one price the plan's winner is the faster config, so the winner is the frontier's first
point (the frontier drops a config that an equally cheap one beats on latency). The
simulation is a stand-in (latency a function of the weight format, so the test knows the
answer); the real search is tests/sim/test_plan.py's."""

from __future__ import annotations

import tomllib

from clients.workloads import WorkloadSpec
from sim.plan import PlanInputs, search
from sim.plan_exec import PoolExecutor
from sim.plan_slo import parse_plan_slo
from sim.plan_space import SearchSpace

TTFT = {"bf16": 0.3, "fp8": 0.1}  # both within the bound; bf16 sorts first by name


def fake_by_quant(argv: list[str]) -> dict:
    with open(argv[argv.index("--config") + 1], "rb") as f:
        (deployment,) = tomllib.load(f)["deployments"]

    def stat(v: float) -> dict:
        return {"mean": v, "p50": v, "p90": v, "p95": v, "p99": v}
    return {"errors": {}, "ttft_s": stat(TTFT[deployment["quant"]]), "tpot_s": stat(0.01),
            "itl_s": stat(0.01), "e2e_s": stat(1.0), "usd_per_mtok": 1.0,
            "requests_per_s": 1.0, "output_tokens_per_s": 1.0}


def test_at_one_price_the_faster_config_wins():
    space = SearchSpace(model="llama-3.1-8b", chips=("rtx-4090",), engines=("vllm",),
                        quants=tuple(TTFT), tps=(1,), max_replicas=4)
    inputs = PlanInputs(space, WorkloadSpec(isl=128, osl=32, rate=1.0, ignore_eos=True), [],
                        parse_plan_slo("ttft_p99=0.5"), runners_up=1)
    plan = search(inputs, PoolExecutor(1), fake_by_quant)
    w, (runner,) = plan["winner"], plan["runners_up"]
    assert w["usd_per_hour"] == runner["usd_per_hour"]  # one price: the tie is real
    assert (w["quant"], runner["quant"]) == ("fp8", "bf16")
    assert plan["frontier"][0]["deployment"] == w["deployment"]
