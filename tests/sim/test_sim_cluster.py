"""Virtual-time clusters (sim/): replicas on one clock behind a router. Prefix-aware routing
wins on a shared-prefix workload, least-requests on a pool of unequal chips, one replica is
exactly today's simulate, and every replica ends idle."""

from __future__ import annotations

import dataclasses
import json

import pytest

from clients.report import summarize
from clients.workloads import WorkloadSpec, build_workload
from doppelchip.cli import main
from server.engine.options import EngineOptions
from server.engine.tokenizer import get_tokenizer
from sim.cluster import build_replicas, fleet_counters, replica_reports, run_replicas
from sim.routers import ROUTERS, make_router

H100 = EngineOptions(name="h100", model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                     engine="vllm", max_model_len=4096)
A100 = EngineOptions(name="a100", model="llama-3.1-8b", quant="bf16", chip="a100-sxm-80g",
                     engine="vllm", max_model_len=4096)


def sessions(**spec):
    tok = get_tokenizer()
    return build_workload(WorkloadSpec(vocab_size=tok.vocab_size, seed=1, **spec),
                          encode=tok.encode)


def run(deployments, router, work):
    cr = run_replicas(build_replicas(deployments), work, router)
    return cr, summarize(cr.run.records)


SHARED = dict(kind="shared-prefix", num_requests=64, isl=64, osl=32, rate=20.0,
              system_prompt_len=1024, num_prefixes=4)


def test_prefix_aware_beats_round_robin_on_a_shared_prefix_workload():
    work = sessions(**SHARED)
    pool = [dataclasses.replace(H100, replicas=4)]
    rr_run, rr = run(pool, "round-robin", work)
    pa_run, pa = run(pool, "prefix-aware", work)
    assert rr["requests"] == pa["requests"] == 64
    hit_rr = fleet_counters(rr_run)["prefix_cache_hit_rate"]
    hit_pa = fleet_counters(pa_run)["prefix_cache_hit_rate"]
    assert hit_pa > hit_rr + 0.1
    assert pa["ttft_s"]["mean"] < rr["ttft_s"]["mean"]
    assert pa["cached_prompt_tokens"] > rr["cached_prompt_tokens"]
    # each of the four prefix groups sticks to one replica, so every replica has work
    assert all(r["requests"] > 0 for r in replica_reports(pa_run))


def test_least_requests_beats_round_robin_on_unequal_chips():
    work = sessions(kind="random", num_requests=200, isl=512, osl=64, rate=40.0)
    rr_run, rr = run([H100, A100], "round-robin", work)
    lr_run, lr = run([H100, A100], "least-requests", work)
    assert lr["ttft_s"]["p99"] < rr["ttft_s"]["p99"]
    by_name = {r["name"]: r["requests"] for r in replica_reports(lr_run)}
    assert by_name["h100"] > by_name["a100"]  # the faster chip frees its seats sooner
    assert [r["requests"] for r in replica_reports(rr_run)] == [100, 100]


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_every_replica_is_idle_at_the_end(router):
    work = sessions(**{**SHARED, "num_requests": 24})
    cr, s = run([dataclasses.replace(H100, replicas=2), A100], router, work)
    assert s["requests"] == 24 and not s["errors"]
    assert sum(r["requests"] for r in replica_reports(cr)) == 24
    for r in cr.replicas:
        sched = r.core.scheduler
        sched.check_integrity()
        assert not r.core.has_unfinished()
        assert sched.pool.num_used == sched.cache.evictable_blocks  # only the cache holds KV


def test_p2c_is_seeded():
    cores = [r.core for r in build_replicas([dataclasses.replace(H100, replicas=4)])]
    draws = [[make_router("p2c", cores, seed).choose((), [0, 1, 2, 3]) for _ in range(20)]
             for seed in (7, 7, 8)]
    assert draws[0] == draws[1] != draws[2]
    with pytest.raises(ValueError, match="unknown router"):
        make_router("random", cores)


FLEET_ONE = """
[[deployments]]
name = "one"
model = "llama-3.1-8b"
quant = "bf16"
chip = "h100-sxm"
engine = "vllm"
max_model_len = 2048
"""
WORK = ["--workload", "shared-prefix", "--num-requests", "24", "--isl", "32", "--osl", "16",
        "--rate", "30", "--system-prompt-len", "256", "--seed", "3", "--json"]


def simulate(capsys, *argv):
    code = main(["simulate", *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_one_replica_cluster_is_todays_simulate(tmp_path, capsys):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET_ONE)
    today = simulate(capsys, "--config", str(fleet), *WORK)
    pooled = simulate(capsys, "--config", str(fleet), "--router", "least-kv", *WORK)
    assert "replicas" not in today
    assert pooled.pop("router") == "least-kv"
    replicas = pooled.pop("replicas")
    assert pooled == today
    assert replicas == [{"name": "one", "deployment": "one", "chip": "h100-sxm",
                         "requests": 24, "errors": 0,
                         "prefix_cache_hit_rate": today["prefix_cache_hit_rate"]}]


def test_a_fleet_file_pools_every_deployment(tmp_path, capsys):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET_ONE.replace('name = "one"', 'name = "one"\nreplicas = 3')
                     + FLEET_ONE.replace('"one"', '"two"').replace("h100-sxm", "a100-sxm-80g"))
    s = simulate(capsys, "--config", str(fleet), "--router", "round-robin", *WORK)
    assert [r["name"] for r in s["replicas"]] == ["one/0", "one/1", "one/2", "two"]
    assert [r["requests"] for r in s["replicas"]] == [6, 6, 6, 6]
    assert s["requests"] == 24 and s["deployment"] == "one×3 + two×1"
    one = simulate(capsys, "--config", str(fleet), "--deployment", "one", *WORK)
    assert [r["name"] for r in one["replicas"]] == ["one/0", "one/1", "one/2"]
    assert one["router"] == "round-robin"  # replicas > 1: pooled even without --router


def test_a_router_without_a_fleet_file_pools_the_default_deployment_alone(capsys):
    """The built-in fleet's other deployments serve other models (a 70B on Groq): a router,
    timeline or SLO-class flag without --config does not send an 8B workload to them."""
    s = simulate(capsys, "--router", "least-requests", *WORK)
    assert [r["deployment"] for r in s["replicas"]] == ["vllm-h100"]
    assert s["deployment"] == "vllm-h100"


def test_replicas_must_be_positive(tmp_path, capsys):
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET_ONE + "replicas = 0\n")
    assert main(["simulate", "--config", str(fleet), *WORK]) == 2
    assert "replicas must be >= 1" in capsys.readouterr().err
