"""vLLM's two Grafana dashboards, unmodified (tests/observability/fixtures), through a real
Prometheus against a one-deployment pod under this test's own HTTP load: every panel query
returns data, and the load-driven panels (HTTP requests, TTFT, latency, tokens, KV and prefix
cache, the queue) show non-zero values at some point of the load.

The pod serves `meta-llama/Llama-3.1-8B-Instruct` (`--served-model-name`) from a four-seat
`vllm` deployment at real time, so the load queues (12 streams) and lasts a few seconds; its
prompts share prefixes (prefix-cache hits) and some stop on a stop string. Grafana's variables
are substituted as a user's selection would: `$model_name` the served name, `$job`/`$instance`
any, `$__rate_interval` 1m, `$__range` the whole test, the SLO pickers the first option that
is a bucket boundary of the series they select."""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
import time
from pathlib import Path

import httpx
from fleets import fleet_doc
from server_proc import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "observability"))
from obs_prometheus import free_port, range_values, running_prometheus, substitute

FIXTURES = Path(__file__).resolve().parents[1] / "observability/fixtures"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"
POD = {"name": "pod", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
       "engine": "vllm", "max_model_len": 1024, "max_num_seqs": 4}
# Panels the load must move (title substrings, case-insensitive): the issue's "HTTP requests,
# TTFT, tokens, cache", and the latencies and queue the same requests fill.
LOAD_DRIVEN = re.compile(
    r"http requests|http mean|time to first|ttft|tok/s|token throughput|requests / s|"
    r"end-to-end|e2e|inter.token|itl|tpot|time per output|kv cache|cache utilization|"
    r"prefix hits|cache hit rates|prompt length|output length|generation length|"
    r"scheduler|running|waiting|finish|queue time|prefill and decode|phase|"
    r"tokens per engine step|max generation|engines", re.IGNORECASE)
# Queries that are 0 or 0/0 by construction on this pod: no 5xx, every target up, no external
# KV connector or multimodal cache, no deferred (structured-output) waiting, no preemption.
ZERO_OK = re.compile(r'status="5xx"|up\{|external_|mm_cache|reason="deferred"|preemptions|'
                     r'finished_reason="error"', re.IGNORECASE)

# A hit ratio divided by `(queries > 0)` has no data while that cache takes no queries, as on
# vLLM without a KV connector (external) or a multimodal model (mm).
EMPTY_OK = re.compile(r"^sum\(rate\(vllm:(external_prefix_cache|mm_cache)_hits_total")


def panels(name: str) -> list[tuple[str, str]]:
    def walk(items):
        for p in items:
            yield p
            yield from walk(p.get("panels", []))

    doc = json.loads((FIXTURES / name).read_text())
    return [(p["title"], t["expr"]) for p in walk(doc["panels"]) for t in p.get("targets", [])
            if t.get("expr")]


def slo_value(dashboard: str, variable: str, scrape: str, family: str) -> str:
    """The first option of a custom SLO variable that is an `le` of `family`."""
    doc = json.loads((FIXTURES / dashboard).read_text())
    var = next(v for v in doc["templating"]["list"] if v["name"] == variable)
    les = set(re.findall(rf'^{re.escape(family)}_bucket{{[^}}]*le="([^"]+)"', scrape, re.M))
    for option in var["query"].split(","):
        value = option.split(":")[1].strip()
        if value in les:
            return value
    raise AssertionError(f"{variable}: no option among {sorted(les)}")


async def drive(base: str) -> int:
    """12 concurrent HTTP clients, 48 requests: completions and streamed chat, prompts in six
    families sharing 60-word prefixes, every fourth with a stop string; returns how many."""
    prefixes = [" ".join(f"family{f} word{w}" for w in range(30)) for f in range(6)]
    sent = 0

    async def worker(h: httpx.AsyncClient, w: int) -> None:
        nonlocal sent
        for j in range(4):
            prompt = f"{prefixes[(w + j) % 6]} question {w}.{j}"
            stop = {"stop": [" the"]} if j % 4 == 3 else {}
            if j % 2:
                r = await h.post("/v1/chat/completions", json={
                    "model": SERVED, "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": 24, "stream": True, **stop})
            else:
                r = await h.post("/v1/completions", json={
                    "model": SERVED, "prompt": prompt, "max_tokens": 24, **stop})
            assert r.status_code == 200, r.text
            sent += 1

    async with httpx.AsyncClient(base_url=base, timeout=60) as h:
        await asyncio.gather(*(worker(h, w) for w in range(12)))
        r = await h.post("/v1/completions", json={"model": SERVED, "prompt": "x",
                                                  "max_tokens": 0})
        assert r.status_code == 400  # a 4xx for the by-status panel
    return sent


def test_both_vllm_dashboards_fill_from_a_pod_under_load(tmp_path):
    port = free_port()
    doc = fleet_doc({"time_scale": 1.0}, [POD])
    server = ServerProcess(doc, "--deployment", "pod", "--served-model-name", SERVED,
                           "--port", "0", "--http-port", str(port))
    with running_prometheus([f"127.0.0.1:{port}"], tmp_path) as prom, server:
        t0 = prom.wait_scraped_after(0.0)
        assert asyncio.run(drive(server.http_url)) == 48
        t1 = prom.wait_scraped_after(time.time())
        scrape = server.scrape()
        assert {m for m in re.findall(r'model_name="([^"]+)"', scrape)} == {SERVED}
        values = {"$model_name": SERVED, "$job": ".*", "$instance": ".*",
                  "$__rate_interval": "1m", "$__range": f"{int(t1 - t0) + 60}s"}
        values["$ttft_slo"] = slo_value("vllm_overview.json", "ttft_slo", scrape,
                                        "vllm:time_to_first_token_seconds")
        values["$tpot_slo"] = slo_value("vllm_overview.json", "tpot_slo", scrape,
                                        "vllm:request_time_per_output_token_seconds")
        checked = moved = 0
        with_data: dict[tuple[str, str], bool] = {}
        for dashboard in ("vllm_grafana.json", "vllm_overview.json"):
            for title, expr in panels(dashboard):
                q = substitute(expr, values)
                series = range_values(prom, q, t0, t1)
                checked += 1
                key = (dashboard, title)
                with_data[key] = with_data.get(key, False) or bool(series)
                if not series:  # only a ratio over a cache this pod has not got
                    assert EMPTY_OK.search(q), f"{dashboard} / {title}: no data for {q}"
                elif LOAD_DRIVEN.search(title) and not ZERO_OK.search(q):
                    finite = [v for v in series if math.isfinite(v)]
                    assert finite and max(finite) > 0, f"{dashboard} / {title}: {q} -> {series}"
                    moved += 1
        assert [k for k, ok in with_data.items() if not ok] == []
        assert (len(with_data), checked) == (12 + 42, 111) and moved >= 90, (checked, moved)
