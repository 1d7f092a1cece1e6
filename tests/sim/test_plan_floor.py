"""The plan's latency floor is sound when lengths vary: a goodput fraction f is met when the
f·N shortest requests meet the bounds, so a lone request of the mean prompt missing a bound
does not prune a config — a lone request of the prompt at quantile f does (capped at the
mean). Before, `plan` pruned every config of a workload whose short requests alone meet a
low goodput fraction, and answered that nothing meets the SLO."""

from __future__ import annotations

import contextlib
import io
import json

from clients.workloads import WorkloadSpec
from devices import estimate
from doppelchip.cli import main
from sim.plan import EOS_MEAN, shape
from sim.plan_slo import parse_plan_slo
from sim.plan_space import Config, WorkloadShape, prompt_floor, prompt_quantiles, size

CONFIG = Config("rtx-4090", "vllm", "bf16", "llama-2-7b", tp=1)
ISL, SPREAD = 2000, 0.9  # prompts uniform over 200..3800 tokens (the context is 4096)


def test_prompt_quantiles_are_never_above_the_share_they_name():
    work = WorkloadShape(1.0, 50, 1.0, 1, None, prompt_quantiles(range(100, 0, -1)))
    assert [work.prompt_at(q) for q in (0.0, 0.01, 0.3, 0.305, 1.0)] == [1, 1, 30, 30, 100]
    slo = parse_plan_slo("ttft=1,goodput=0.3")
    assert prompt_floor(work, slo) == 30  # the longest of the 30 shortest
    assert prompt_floor(work, parse_plan_slo("ttft=1,goodput=0.9")) == 50  # capped at the mean
    assert prompt_floor(work, parse_plan_slo("ttft_p50=1")) == 50


def bound() -> float:
    """A TTFT bound a lone request of 60% of the mean prompt meets and one of the mean misses
    (about a quarter of the prompts are that short)."""
    return 0.6 * estimate(CONFIG.options().spec(), ISL, 16, 1)["ttft_s"]


def test_a_low_goodput_fraction_keeps_a_config_only_its_short_requests_can_serve():
    slo = parse_plan_slo(f"ttft={bound():.6f},goodput=0.15")
    fixed = shape(WorkloadSpec(isl=ISL, osl=16, rate=0.2, ignore_eos=True), EOS_MEAN)
    assert size(CONFIG, fixed, slo).startswith("unloaded ttft")  # every prompt is the mean
    varied = shape(WorkloadSpec(isl=ISL, osl=16, rate=0.2, ignore_eos=True, num_requests=80,
                                length_dist="uniform", length_spread=SPREAD), EOS_MEAN)
    assert not isinstance(size(CONFIG, varied, slo), str)


def test_plan_finds_the_fleet_the_short_requests_make_meet_the_slo():
    argv = ["plan", "--model", "llama-2-7b", "--chips", "rtx-4090", "--engines", "vllm",
            "--quants", "bf16", "--tp", "1", "--max-replicas", "2", "--runners-up", "0",
            "--isl", str(ISL), "--osl", "16", "--ignore-eos", "--rate", "0.2",
            "--num-requests", "80", "--length-dist", "uniform", "--length-spread", str(SPREAD),
            "--slo", f"ttft={bound():.6f},goodput=0.15", "--jobs", "1", "--json"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        rc = main(argv)
    out = json.loads(buf.getvalue().strip().splitlines()[-1])
    assert rc == 0, out
    assert out["meets_slo"] and 0.15 <= out["goodput_fraction"] < 0.9
