"""The plan's SLO syntax and its analytic pruning, before anything is simulated."""

from __future__ import annotations

import pytest

from clients.workloads import WorkloadSpec
from sim.plan import shape
from sim.plan_slo import PlanSlo, check, parse_plan_slo
from sim.plan_space import Config, SearchSpace, configs, expand, output_mean, size


def test_slo_terms():
    slo = parse_plan_slo("ttft=0.2,tpot=0.05,goodput=0.95,e2e_p99=4")
    assert slo == PlanSlo({"ttft": 0.2, "tpot": 0.05}, 0.95, {("e2e", "p99"): 4.0})
    assert slo.simulate_flag() == "ttft=0.2,tpot=0.05"
    assert slo.latency_key() == ("e2e", "p99")
    assert parse_plan_slo("ttft=0.2").goodput == 0.9  # load --slo-attainment's default
    assert parse_plan_slo("ttft=0.2").latency_key() == ("ttft", "p99")


@pytest.mark.parametrize("text", ["", "ttft", "ttfb=1", "ttft_p42=1", "goodput=1.5",
                                  "ttft=0", "goodput=x", "e2e_p99"])
def test_bad_slo_says_why(text):
    with pytest.raises(ValueError):
        parse_plan_slo(text)


def summary(fraction=1.0, ttft_p99=0.1, errors=None):
    stat = {"p50": 0.0, "p90": 0.0, "p95": 0.0, "p99": 0.0, "mean": 0.0}
    return {"errors": errors or {}, "goodput": {"fraction": fraction},
            "ttft_s": {**stat, "p99": ttft_p99}, "tpot_s": stat, "itl_s": stat, "e2e_s": stat}


def test_check_names_every_miss():
    slo = parse_plan_slo("ttft=0.2,goodput=0.9,ttft_p99=0.15")
    assert check(summary(), slo) == []
    assert len(check(summary(fraction=0.8), slo)) == 1
    assert len(check(summary(ttft_p99=0.2), slo)) == 1
    assert len(check(summary(fraction=0.5, ttft_p99=0.3, errors={"RESOURCE_EXHAUSTED": 2}),
                     slo)) == 3


def test_expected_output_tokens():
    assert output_mean(64, True, 128.0) == 64
    # E[min(G, n)] for the geometric EOS draw: below both the cap and the mean
    assert 0 < output_mean(256, False, 128.0) < 128
    assert output_mean(10_000, False, 128.0) == pytest.approx(128.0)


WORK = shape(WorkloadSpec(num_requests=100, isl=512, osl=128, rate=50.0, ignore_eos=True),
             128.0)


def test_what_cannot_place_or_cannot_be_fast_enough_is_pruned():
    slo = parse_plan_slo("ttft=0.5")
    big = Config("rtx-4090", "vllm", "bf16", "llama-3.1-70b", tp=1)
    assert size(big, WORK, slo).startswith("does not place")
    small = Config("rtx-4090", "vllm", "bf16", "llama-3.1-8b", tp=1)
    sized = size(small, WORK, slo)
    assert not isinstance(sized, str) and sized.min_replicas >= 1
    strict = size(small, WORK, parse_plan_slo("ttft=0.001"))  # no load makes it that fast
    assert isinstance(strict, str) and strict.startswith("unloaded ttft")


def test_lower_bound_grows_with_the_rate():
    slo = parse_plan_slo("ttft=0.5")
    c = Config("h100-sxm", "vllm", "bf16", "llama-3.1-8b", tp=1)
    lb = [size(c, shape(WorkloadSpec(isl=512, osl=128, rate=r, ignore_eos=True), 128.0),
               slo).min_replicas for r in (10.0, 100.0, 1000.0)]
    assert lb[0] <= lb[1] <= lb[2] and lb[2] > lb[0]


def test_grid_respects_the_catalogue():
    space = SearchSpace(model="llama-3.1-8b", chips=("h100-sxm", "m4-max-40", "groq-lpu-v1"),
                        engines=("vllm", "mlx", "groq"), quants=("bf16", "mlx-4bit"),
                        tps=(1, 2))
    got = {(c.chip, c.engine, c.quant, c.tp) for c in expand(space)}
    assert ("h100-sxm", "vllm", "bf16", 2) in got
    assert ("m4-max-40", "mlx", "mlx-4bit", 1) in got
    assert not any(chip == "h100-sxm" and engine != "vllm" for chip, engine, _, _ in got)
    assert not any(chip != "h100-sxm" and tp > 1 for chip, _, _, tp in got)  # one shape
    kept, pruned = configs(space, WORK, parse_plan_slo("ttft=0.5"))
    groq = [s for s in kept if s.config.chip == "groq-lpu-v1"]
    assert groq and all(s.config.count and s.config.count > 1 for s in groq)  # sized chips
    assert len(kept) + len(pruned) == len(list(expand(space)))  # every shape in every serving mode
    assert {s.config.mode for s in kept} == set(space.modes)


@pytest.mark.parametrize(("flags", "says"), [
    (["--slo", "ttft=0.2"], "--rate"),  # no rate: the default is inf, nothing to plan for
    (["--slo", "ttft=0.2", "--rate", "10", "--chips", "h100"], "unknown chip h100"),
    (["--slo", "ttfb=0.2", "--rate", "10"], "bad SLO term"),
    (["--slo", "ttft=0.2", "--rate", "10", "--tp", "0"], "--tp"),
])
def test_bad_plan_input_is_exit_2(flags, says, capsys):
    from doppelchip.cli import main

    assert main(["plan", "--json", *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and says in captured.err


def test_nothing_meets_the_slo_is_exit_1_and_says_so(capsys):
    import json

    from doppelchip.cli import main

    rc = main(["plan", "--chips", "rtx-4090", "--engines", "vllm", "--quants", "fp8",
               "--tp", "1", "--rate", "10", "--slo", "ttft=0.0001", "--json"])
    assert rc == 1
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["error"] == "no candidate met the SLO"
    assert out["searched"]["simulated"] == 0
    assert out["pruned"] and out["pruned"][0]["why"].startswith("unloaded ttft")
