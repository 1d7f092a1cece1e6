"""`doppelchip plan --dp`: vLLM's data-parallel ranks of a MoE model (one expert group over
every rank's chips) searched as a shape of their own, sized per rank and priced per group; the
shapes that are not that engine's (ranks that are copies, experts over more chips than TP's in
one core) pruned with the flag that searches them."""

from __future__ import annotations

import pytest
from plan_grid import run_command

from clients.workloads import WorkloadSpec
from devices import DeploymentSpec, catalog, estimate
from sim.plan import shape
from sim.plan_slo import parse_plan_slo
from sim.plan_space import Config, SearchSpace, configs, expand, size

MOE = "qwen3-30b-a3b"
SLO = parse_plan_slo("ttft=1,tpot=0.05")
WORK = shape(WorkloadSpec(num_requests=100, isl=512, osl=128, rate=20.0, ignore_eos=True),
             128.0)


def test_a_rank_estimate_is_one_ranks_share_of_the_group():
    rank = DeploymentSpec(model=MOE, quant="bf16", chip="h100-sxm", engine="vllm", tp=1)
    one = estimate(rank, 512, 128, 32, ranks=4)
    copy = estimate(rank, 512, 128, 32)  # the same chip alone, the whole model on it
    assert one["fits"] and one["data_parallel_size"] == 4 and one["chips"] == 1
    # one chip's price, not the group's four (the rank view's plan is the group's)
    assert one["usd_per_hour"] == pytest.approx(copy["usd_per_hour"])
    # a quarter of the experts per chip leaves more of it to KV than the whole model does
    assert one["kv_tokens"] > copy["kv_tokens"]


def test_ranks_are_sized_per_rank_and_priced_per_group():
    dp = size(Config("h100-sxm", "vllm", "bf16", MOE, tp=1, dp=2), WORK, SLO)
    tp = size(Config("h100-sxm", "vllm", "bf16", MOE, tp=2, ep=2), WORK, SLO)
    assert not isinstance(dp, str) and not isinstance(tp, str)
    assert dp.chips == tp.chips == 2
    assert dp.usd_per_hour == pytest.approx(tp.usd_per_hour)  # two H100s either way
    rank = estimate(DeploymentSpec(model=MOE, quant="bf16", chip="h100-sxm", engine="vllm",
                                   tp=1, max_batch=dp.batch), 512, 128, dp.batch, ranks=2)
    assert dp.replica_output_tokens_per_s == pytest.approx(2 * rank["output_tokens_per_s"])
    # the reason wide EP exists: attention data-parallel, no all-reduce per layer, and the
    # experts' memory split, so two ranks outrun one TP-2 core on the same chips
    assert dp.replica_output_tokens_per_s > tp.replica_output_tokens_per_s


def test_only_the_engines_own_data_parallel_shapes_are_searched():
    space = SearchSpace(model=MOE, chips=("h100-sxm",), engines=("vllm", "sglang"),
                        quants=("bf16",), tps=(1, 2), eps=(None, 2), dps=(1, 2),
                        modes=("aggregated",))
    got = list(expand(space))
    assert len(got) == len(set(got))
    # vLLM's ranks shard the experts over tp × dp chips: `ep` is implied, one shape each
    assert not [c for c in got if c.engine == "vllm" and c.dp > 1 and c.ep]
    assert {(c.tp, c.dp) for c in got if c.engine == "vllm" and c.dp > 1} == {(1, 2), (2, 2)}
    kept, pruned = configs(space, WORK, SLO)
    why = {c.name: reason for c, reason in pruned}
    assert "search --dp 2" in why["vllm-h100-sxm-bf16-tp1ep2"]  # vLLM has no in-core DP
    assert "copies" in why["sglang-h100-sxm-bf16-tp1dp2"]  # SGLang's --dp-size: replicas
    assert "vllm-h100-sxm-bf16-tp1ep2" not in {s.config.name for s in kept}
    assert {"vllm-h100-sxm-bf16-tp1dp2", "sglang-h100-sxm-bf16-tp1ep2"} <= \
        {s.config.name for s in kept}  # SGLang's DP attention stays in one core (`ep`)


def test_a_dense_models_ranks_are_replicas():
    assert catalog.get_engine("vllm").dp_shares_experts
    dense = size(Config("h100-sxm", "vllm", "bf16", "llama-3.1-8b", tp=1, dp=2), WORK, SLO)
    assert isinstance(dense, str) and "dense model" in dense


def test_plan_writes_the_ranks_and_its_fleet_runs_them(tmp_path):
    fleet, k8s = tmp_path / "winner.toml", tmp_path / "k8s"
    plan = run_command(
        f"doppelchip plan --model {MOE} --chips h100-sxm --engines vllm --quants bf16 "
        "--tp 1 --dp 2 --isl 512 --osl 128 --ignore-eos --num-requests 200 --rate 20 "
        f"--slo ttft=1,tpot=0.05 --jobs 1 --runners-up 0 --write-fleet {fleet} "
        f"--write-k8s {k8s} --json")
    assert plan["meets_slo"] and plan["dp"] == 2
    assert plan["chips"] == 2 * plan["replicas"]
    assert plan["usd_per_hour"] == pytest.approx(
        catalog.get_chip("h100-sxm").usd_per_hour * plan["chips"])
    assert "data_parallel_size = 2" in fleet.read_text()
    pod = (k8s / "vllm-h100-sxm-bf16-tp1dp2.yaml").read_text()  # the pod runs both ranks
    assert "- --data-parallel-size\n" in pod and "- '2'\n" in pod.split("--data-parallel-size")[1]
    again = run_command(plan["simulate_command"])
    names = [r["name"] for r in again["replicas"]]
    assert len(names) == 2 * plan["replicas"] and all("/dp" in n for n in names)
    assert again["usd_per_mtok"] == plan["usd_per_mtok"]
