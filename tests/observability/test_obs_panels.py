"""A real Prometheus scrapes a loaded doppelchip; every dashboard query must answer with data.

The load (`obs_load`) preempts, compiles and pages weights in from SSD; then each panel query
of each generated dashboard runs through Prometheus's HTTP API with its variables substituted
by real label values, and must return non-empty, finite data. Counters and histograms are
checked against what the clients received.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import re
import time
from collections import defaultdict

import obs_load
import pytest
from obs_prometheus import ROOT, Prometheus, free_port, running_prometheus
from server_proc import ServerProcess

from clients.client import AsyncClient

FALLBACK = re.compile(r"\bor\b|vector\(|absent|clamp_min|default", re.IGNORECASE)
WINDOW = "2m"  # covers the whole test: rates see every sample of the load


def load_generator():
    spec = importlib.util.spec_from_file_location("grafana_generate",
                                                  ROOT / "deploy/grafana/generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def substitute(expr: str, deployments: list[str]) -> str:
    return (expr.replace("$deployment", "|".join(deployments))
            .replace("$__rate_interval", WINDOW).replace("$__range", WINDOW))


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    """(prometheus, results, t0 before the load, t1 after it, each engine core's own
    cumulative counters as it logged them when it stopped)."""
    metrics_port = free_port()
    state: dict = {}
    server = ServerProcess(obs_load.fleet_doc(), "--port", "0", "--http-port",
                           str(metrics_port))

    async def run(prom: Prometheus) -> None:
        state["t0"] = await asyncio.to_thread(prom.wait_scraped_after, 0.0)
        async with AsyncClient(server.target) as client:
            state["results"] = await obs_load.drive(client)
        state["t1"] = await asyncio.to_thread(prom.wait_scraped_after, time.time())

    folder = tmp_path_factory.mktemp("prometheus")
    with running_prometheus([f"127.0.0.1:{metrics_port}"], folder) as prom:
        with server:
            asyncio.run(run(prom))
        state["core"] = core_stats(server.log)
        yield prom, state["results"], state["t0"], state["t1"], state["core"]


def core_stats(log: str) -> dict[str, dict[str, float]]:
    """deployment -> the engine core's counters from its "stopped" log line."""
    found = {}
    for m in re.finditer(r"engine core of (\S+) \(rank 0\) stopped: (.*)", log):
        found[m.group(1)] = {k: float(v) for k, v in
                             (item.split("=") for item in m.group(2).split())}
    return found


def by_deployment(prom: Prometheus, expr: str, at: float) -> dict[str, float]:
    return {r["metric"]["deployment"]: float(r["value"][1]) for r in prom.query(expr, at)}


def test_every_panel_query_returns_finite_data(observed):
    prom, _results, _t0, t1, _core = observed
    gen = load_generator()
    deployments = sorted(obs_load.LOAD)
    titles, checked = set(), 0
    for name, build in gen.DASHBOARDS.items():
        for panel in build()["panels"]:
            titles.add(panel["title"])
            for target in panel["targets"]:
                expr = target["expr"]
                assert not FALLBACK.search(expr), f"{name} {panel['title']}: fallback in {expr}"
                result = prom.query(substitute(expr, deployments), t1)
                assert result, f"{name} / {panel['title']}: no data for {expr}"
                values = [float(r["value"][1]) for r in result]
                assert all(math.isfinite(v) for v in values), \
                    f"{name} / {panel['title']}: non-finite {result}"
                checked += 1
    assert checked >= 40
    required = {"Time to first token", "Inter-token latency", "End-to-end latency",
                "Token throughput", "Scheduler state", "KV-cache usage",
                "Prefix-cache hit rate", "Finish reasons", "Preemptions", "Compile stalls",
                "Bandwidth utilisation per tier", "Cost per million tokens",
                "Cost per million prompt tokens", "CPU KV tier traffic", "CPU KV tier hit rate"}
    assert required <= titles


def test_load_shows_preemptions_compiles_and_ssd_page_ins(observed):
    prom, _results, _t0, t1, _core = observed
    preempt = by_deployment(prom, "sum by (deployment) (vllm:num_preemptions_total)", t1)
    assert preempt["vllm-small-kv"] > 0
    compiles = prom.query("sum by (deployment, reason) (doppelchip_compile_events_total)", t1)
    reasons = {(r["metric"]["deployment"], r["metric"]["reason"]) for r in compiles}
    assert {("mlx-m4max", "new_shape"), ("mlx-m4max", "cold_start"),
            ("groq-recompile", "recompile")} <= reasons
    idle = by_deployment(prom, "sum by (deployment) (doppelchip_pipeline_idle_seconds_total)", t1)
    assert idle["groq-recompile"] >= 60.0  # one 60 s Groq recompile
    ssd = by_deployment(prom, "sum by (deployment) (doppelchip_ssd_page_in_bytes_total)", t1)
    assert ssd["llamacpp-ssd"] > 100e9  # > 100 GB of CPU layers re-read per token
    assert all(v == 0 for d, v in ssd.items() if d != "llamacpp-ssd")
    hits = by_deployment(prom, "sum by (deployment) (vllm:prefix_cache_hits_total)", t1)
    assert hits["vllm-small-kv"] > 0
    host = by_deployment(prom, "sum by (deployment) (vllm:external_prefix_cache_hits_total)", t1)
    # the first prompt's blocks the device evicted came back from host memory, whole blocks
    block = next(d["block_size"] for d in obs_load.DEPLOYMENTS if d["name"] == "vllm-offload")
    assert host["vllm-offload"] > 0 and host["vllm-offload"] % block == 0
    loaded = by_deployment(prom, "sum by (deployment) (vllm:kv_offload_load_bytes_total)", t1)
    assert loaded["vllm-offload"] > 0


def test_token_counters_match_what_clients_received(observed):
    prom, results, t0, t1, _core = observed
    received, prompts = defaultdict(int), defaultdict(int)
    for r in results:
        received[r.deployment] += r.tokens
        prompts[r.deployment] += r.prompt_tokens
        assert r.tokens == r.completion_tokens
    for metric, expected in (("vllm:generation_tokens_total", received),
                             ("vllm:prompt_tokens_total", prompts)):
        increase = by_deployment(
            prom, f"sum by (deployment) ({metric}) - sum by (deployment) ({metric} @ {t0:.3f})",
            t1)
        assert increase == {d: float(n) for d, n in expected.items()}, metric


def test_histograms_agree_with_clients(observed):
    prom, results, _t0, t1, _core = observed
    done, ttft, e2e, itl = (defaultdict(int), defaultdict(float), defaultdict(float),
                            defaultdict(int))
    for r in results:
        done[r.deployment] += 1
        ttft[r.deployment] += r.ttft_s
        e2e[r.deployment] += r.e2e_s
        itl[r.deployment] += r.completion_tokens - 1  # one token per chunk: n-1 intervals
    for hist in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_queue_time_seconds", "vllm:request_prompt_tokens"):
        counts = by_deployment(prom, f"sum by (deployment) ({hist}_count)", t1)
        assert counts == {d: float(n) for d, n in done.items()}, hist
    for hist, sums in (("vllm:time_to_first_token_seconds", ttft),
                       ("vllm:e2e_request_latency_seconds", e2e)):
        got = by_deployment(prom, f"sum by (deployment) ({hist}_sum)", t1)
        for d, s in sums.items():
            assert got[d] == pytest.approx(s, rel=1e-6), (hist, d)
    for hist in ("vllm:inter_token_latency_seconds", "doppelchip_inter_token_latency_seconds"):
        counts = by_deployment(prom, f"sum by (deployment) ({hist}_count)", t1)
        assert counts == {d: float(n) for d, n in itl.items()}, hist
    # no pile-up beyond the largest finite bucket of any vLLM latency histogram
    for hist in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:e2e_request_latency_seconds"):
        overflow = prom.query(
            f'sum by (deployment) ({hist}_bucket{{le="+Inf"}}) - on (deployment) '
            f"max by (deployment) ({hist}_bucket{{le!=\"+Inf\"}})", t1)
        assert all(float(r["value"][1]) == 0 for r in overflow), (hist, overflow)
    # the fine histogram resolves the H100's ~6 ms tokens, which vLLM's 10 ms bucket lumps
    h100 = 'deployment="vllm-small-kv"'
    fine_low = prom.scalar(
        f'sum(doppelchip_inter_token_latency_seconds_bucket{{{h100},le="0.0075"}})', t1)
    vllm_low = prom.scalar(f'sum(vllm:inter_token_latency_seconds_bucket{{{h100},le="0.01"}})',
                           t1)
    assert fine_low > 0 and vllm_low >= fine_low
    p50 = prom.scalar(
        "histogram_quantile(0.5, sum by (le) "
        f"(doppelchip_inter_token_latency_seconds_bucket{{{h100}}}))", t1)
    assert 0.001 < p50 < 0.01


def test_device_counters_agree_with_the_core(observed):
    prom, _results, _t0, t1, core = observed
    for metric, field in (("doppelchip_tier_bytes_total", "bytes"),
                          ("doppelchip_flops_total", "flops"),
                          ("doppelchip_busy_seconds_total", "busy_s"),
                          ("doppelchip_bound_seconds_total", "busy_s"),
                          ("doppelchip_pipeline_idle_seconds_total", "stall_s")):
        got = by_deployment(prom, f"sum by (deployment) ({metric})", t1)
        assert set(core) == set(got)
        for name, stats in core.items():
            assert got[name] == pytest.approx(stats[field], rel=1e-9), (metric, name)
    # energy and cost also count the idle time up to the scrape (extrapolated at idle power
    # while the engine sleeps): never more than the core had charged by the time it stopped
    for metric, field in (("doppelchip_energy_joules_total", "joules"),
                          ("doppelchip_cost_dollars_total", "dollars")):
        got = by_deployment(prom, f"sum by (deployment) ({metric})", t1)
        for name, stats in core.items():
            assert 0 < got[name] <= stats[field] * (1 + 1e-9), (metric, name)
