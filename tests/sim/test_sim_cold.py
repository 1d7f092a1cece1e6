"""A cold start in virtual time (`start = "cold"`, `simulate --cold`): the replica serves only
after the device model's cold start (weights' load plus the engine's build or warm-up), is
billed while it builds, and does not pay the compile again at its first steps."""

from __future__ import annotations

import dataclasses
import json
import math

from clients.workloads import WorkloadSpec
from doppelchip.cli import main
from server.engine.build import build_core
from server.engine.options import EngineOptions
from sim.simulation import simulate_conversations

TRT = EngineOptions(name="trt", model="llama-3.1-8b", quant="fp8", chip="h100-sxm",
                    engine="tensorrt-llm", built_for="hopper", max_model_len=2048)
JETSTREAM = EngineOptions(name="js", model="llama-3.1-8b", quant="bf16", chip="tpu-v5e",
                          engine="jetstream", count=8, max_model_len=2048)
WORK = WorkloadSpec(kind="random", num_requests=20, isl=200, osl=32, rate=5)


def _cold(options: EngineOptions) -> EngineOptions:
    return dataclasses.replace(options, start="cold")


def test_a_cold_replica_serves_only_after_its_cold_start():
    startup = build_core(_cold(TRT)).startup_s
    assert startup > 60  # an 8B TensorRT-LLM build is minutes (hardware.md)
    warm, warm_recs = simulate_conversations(TRT, WORK)
    cold, cold_recs = simulate_conversations(_cold(TRT), WORK)
    assert warm["cold_start_s"] == 0 and cold["cold_start_s"] == startup
    assert min(r.token_times[0] for r in warm_recs) < startup
    assert min(r.token_times[0] for r in cold_recs) >= startup
    assert cold["emulated_s"] >= startup > warm["emulated_s"]
    # the replica is paid for while it builds: dearer per token than the warm run
    assert cold["usd_per_mtok"] > warm["usd_per_mtok"]
    assert cold["output_tokens"] == warm["output_tokens"]


def test_a_cold_jetstream_compiles_its_buckets_once_at_start_up():
    """JetStream's warm-up compiles every bucket in the cold start; the steps after it find
    them compiled (the cold run does not compile more than the warm one)."""
    warm, _ = simulate_conversations(JETSTREAM, WORK)
    cold, recs = simulate_conversations(_cold(JETSTREAM), WORK)
    assert cold["cold_start_s"] > 0
    assert cold["compiles"] == warm["compiles"]
    assert math.isclose(cold["compile_stall_s"], warm["compile_stall_s"])
    assert min(r.token_times[0] for r in recs) >= cold["cold_start_s"]


def test_a_cold_run_is_the_same_macro_or_single_stepped():
    (s1, r1), (s2, r2) = (simulate_conversations(_cold(TRT), WORK, macro_steps=m)
                          for m in (False, True))
    assert s1["steps"] == s2["steps"] and s1["output_tokens"] == s2["output_tokens"]
    for a, b in zip(r1, r2, strict=True):
        assert all(math.isclose(x, y, rel_tol=1e-9)
                   for x, y in zip(a.token_times, b.token_times, strict=True))


def test_simulate_cold_flag_and_a_cold_fleet(tmp_path, capsys):
    flags = ["--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b", "--quant",
             "fp8", "--workload", "random", "--isl", "128", "--osl", "16", "--num-requests",
             "5", "--rate", "5"]
    assert main(["simulate", *flags]) == 0
    assert "cold start" not in capsys.readouterr().out
    assert main(["simulate", *flags, "--cold"]) == 0
    assert "cold start" in capsys.readouterr().out  # vLLM loads its weights
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[deployments]]\nname = "a"\nmodel = "llama-3.1-8b"\nquant = "fp8"\n'
                     'chip = "h100-sxm"\nengine = "vllm"\nreplicas = 2\nstart = "cold"\n\n'
                     '[[deployments]]\nname = "b"\nmodel = "llama-3.1-8b"\nquant = "fp8"\n'
                     'chip = "h100-sxm"\nengine = "vllm"\n')
    assert main(["simulate", "--config", str(fleet), "--router", "round-robin", "--workload",
                 "random", "--isl", "128", "--osl", "16", "--num-requests", "6", "--rate",
                 "50", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    a = build_core(EngineOptions(name="a", model="llama-3.1-8b", quant="fp8", chip="h100-sxm",
                                 engine="vllm", start="cold")).startup_s
    assert summary["cold_start_s"] == a > 0  # the fleet is whole once its slowest is built
