"""ep, kv_cache_dtype and speculative_config work the same in a fleet file, simulate and
estimate: they are fields of EngineOptions, checked where the deployment is placed."""

from __future__ import annotations

import json
import tomllib

import pytest

from doppelchip.cli import main
from server.config import parse_fleet
from server.engine.build import build_core

FLEET = """
[[deployments]]
name = "dsv3"
model = "deepseek-v3"
quant = "fp8"
chip = "h200-sxm"
engine = "sglang"
count = 8
ep = 8
kv_cache_dtype = "fp8"
speculative_config = '{"method": "mtp", "num_speculative_tokens": 1, "acceptance_rate": 0.8}'
"""


def test_fleet_file_keys_reach_the_placement_and_the_scheduler():
    (opts,) = parse_fleet(tomllib.loads(FLEET)).deployments
    core = build_core(opts)
    pl = core.placement
    assert (pl.tp, pl.dp, pl.ep, pl.kv_bytes) == (1, 8, 8, 1.0)
    assert core.scheduler.config.num_speculative_tokens == 1
    assert core.speculative is not None and core.speculative.method == "mtp"


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--ep", "3"], "must divide"), (["--kv-cache-dtype", "fp8"], None)],
)
def test_simulate_and_estimate_take_the_same_flags(capsys, extra, message):
    base = ["--chip", "h200-sxm", "--engine", "vllm", "--model", "qwen3-235b-a22b",
            "--quant", "fp8", "--count", "8"]
    sim = main(["simulate", *base, *extra, "--num-requests", "4", "--isl", "64", "--osl", "8",
                "--json"])
    est = main(["estimate", *base, *extra, "--prompt", "64", "--output", "8", "--json"])
    out = capsys.readouterr()
    if message is None:
        assert sim == est == 0
        assert json.loads(out.out.strip().splitlines()[-1])["fits"] is True
    else:
        assert sim == est == 2 and out.err.count(message) + out.out.count(message) == 2


def test_speculative_config_flag_in_simulate_and_estimate(capsys):
    cfg = '{"method": "eagle3", "num_speculative_tokens": 2, "acceptance_rate": 0.6}'
    base = ["--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b", "--quant",
            "bf16", "--speculative-config", cfg]
    assert main(["estimate", *base, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["tokens_per_step"] == pytest.approx(1 + 0.6 + 0.36)
    assert main(["simulate", *base, "--num-requests", "2", "--isl", "32", "--osl", "32"]) == 0
    assert main(["estimate", *base[:-1], '{"method": "ngram"}']) == 2
