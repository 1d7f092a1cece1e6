"""`doppelchip plan --kv-offloading-size`: vLLM's CPU KV tier as a search dimension. On a
multi-turn chat whose conversations outgrow a small GPU's cache between turns, a tier of host
memory (which the instance price already pays for) lets fewer GPUs meet the SLO: turns load
their history over PCIe instead of prefilling it again. Shapes that cannot have a tier (no
host link) are pruned saying so."""

from __future__ import annotations

from plan_grid import run_command

from clients.workloads import WorkloadSpec
from sim.plan import shape
from sim.plan_slo import parse_plan_slo
from sim.plan_space import Config, size

SLO = "ttft=0.5,tpot=0.05"


def test_a_host_tier_lets_fewer_gpus_meet_the_slo(tmp_path):
    fleet = tmp_path / "winner.toml"
    plan = run_command(
        "doppelchip plan --model llama-3.1-8b --chips rtx-4090 --engines vllm --quants fp8 "
        "--tp 1 --kv-offloading-size 0,32 --workload multi-turn --turns 4 --think-time 10 "
        f"--isl 1500 --osl 100 --num-requests 200 --rate 2 --slo {SLO} --jobs 1 "
        f"--write-fleet {fleet} --json")
    assert plan["kv_offloading_size"] == 32 and plan["meets_slo"]
    (without,) = [r for r in plan["runners_up"] if r["kv_offloading_size"] is None]
    assert plan["replicas"] < without["replicas"]  # each at its own cheapest passing count
    assert plan["usd_per_hour"] < without["usd_per_hour"]
    assert "kv_offloading_size = 32.0" in fleet.read_text()
    again = run_command(plan["simulate_command"])
    assert again["kv_offload"]["hit_tokens"] > 0
    assert again["ttft_s"]["p99"] == plan["latency"]["ttft_p99"]


def test_a_chip_without_a_host_link_has_no_tier_to_search():
    work = shape(WorkloadSpec(num_requests=10, isl=256, osl=32, rate=1.0, ignore_eos=True),
                 32.0)
    verdict = size(Config("m4-max-40", "mlx", "mlx-4bit", "llama-3.1-8b",
                          kv_offloading_size=8.0), work, parse_plan_slo("ttft=5"))
    assert isinstance(verdict, str) and "no host link" in verdict
    plain = size(Config("m4-max-40", "mlx", "mlx-4bit", "llama-3.1-8b"), work,
                 parse_plan_slo("ttft=5"))
    assert not isinstance(plain, str)
