"""`data_parallel_size` in virtual time, as `serve` runs it: one engine core per rank behind
vLLM's balancing over its ranks (the `vllm-dp` router), a MoE model's ranks sharing its
experts (each core one rank's view of the group), named `deployment/dp<rank>` in the report;
a pod's local ranks only."""

from __future__ import annotations

import json
from types import SimpleNamespace

from doppelchip.cli import main
from server.engine.options import EngineOptions
from sim.cluster import build_replicas
from sim.routers import VllmDp

MOE = EngineOptions(name="moe", model="qwen3-30b-a3b", quant="bf16", chip="h100-sxm",
                    engine="vllm", max_model_len=4096)
FLEET = """
[[deployments]]
name = "moe"
model = "qwen3-30b-a3b"
quant = "bf16"
chip = "h100-sxm"
engine = "vllm"
max_model_len = 4096
data_parallel_size = 4
"""
WORK = ["--workload", "random", "--isl", "256", "--osl", "32", "--num-requests", "80",
        "--rate", "40", "--seed", "2", "--json"]


def simulate(capsys, *argv):
    code = main(["simulate", *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out.splitlines()[-1])


def test_each_rank_is_a_core_of_its_own_with_one_ranks_share_of_the_group():
    ranks = build_replicas([EngineOptions(**{**MOE.__dict__, "data_parallel_size": 4})])
    copy = build_replicas([MOE])[0].core.placement
    assert [r.name for r in ranks] == ["moe/dp0", "moe/dp1", "moe/dp2", "moe/dp3"]
    assert {r.core.placement.plan.ranks for r in ranks} == {4}
    assert all(r.core.placement.kv_tokens > 2 * copy.kv_tokens for r in ranks)
    assert len({r.options.seed for r in ranks}) == 4  # not in lock-step


def test_a_pods_local_ranks_only():
    opts = EngineOptions(**{**MOE.__dict__, "data_parallel_size": 4,
                            "data_parallel_size_local": 2, "data_parallel_start_rank": 2})
    assert [r.name for r in build_replicas([opts])] == ["moe/dp2", "moe/dp3"]


def test_simulate_runs_every_rank_behind_vllms_least_loaded_balancing(tmp_path, capsys):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    s = simulate(capsys, "--config", str(fleet), "--deployment", "moe", *WORK)
    assert s["router"] == "vllm-dp" and s["chips"] == 4
    assert [r["name"] for r in s["replicas"]] == [f"moe/dp{k}" for k in range(4)]
    assert sum(r["requests"] for r in s["replicas"]) == 80
    assert all(r["requests"] > 0 for r in s["replicas"])
    code = main(["simulate", "--config", str(fleet), "--deployment", "moe", "--autoscale",
                 "metric=waiting,target=4,min=1,max=2", *WORK])
    out = capsys.readouterr()
    assert code != 0 and "data-parallel ranks is not simulated" in out.out + out.err


def rank(running: int, waiting: int, kv_usage: float):
    """A core as the router reads it: its queue and its KV pool (100 blocks)."""
    pool = SimpleNamespace(num_used=round(kv_usage * 100))
    return SimpleNamespace(scheduler=SimpleNamespace(
        num_running=running, num_waiting=waiting, pool=pool,
        cache=SimpleNamespace(evictable_blocks=0), config=SimpleNamespace(num_blocks=100)))


def test_the_vllm_dp_router_scores_ranks_as_vllm_does():
    full_queue, busy = rank(0, 2, 0.9), rank(3, 0, 0.2)  # 2 + 2 × 6 × 0.4 = 6.8 against 3
    assert VllmDp([full_queue, busy]).choose([], [2, 3]) == 1
    assert VllmDp([rank(0, 2, 0.4), busy]).choose([], [2, 3]) == 0  # below half: 2 < 3
    even = VllmDp([rank(1, 0, 0.1), rank(1, 0, 0.1)])  # equal scores: in turn
    assert [even.choose([], [1, 1]) for _ in range(4)] == [0, 1, 0, 1]
    assert VllmDp([rank(0, 0, 0.0), rank(0, 0, 0.0)]).choose([], [5, 0]) == 1  # routed count
