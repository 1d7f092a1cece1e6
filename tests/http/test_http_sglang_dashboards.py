"""SGLang's Grafana dashboard, unmodified (tests/observability/fixtures/sglang_dashboard.json),
through a real Prometheus against an SGLang pod (`--http-api sglang --enable-metrics`) under
this test's own HTTP load on SGLang's native `/generate`: every panel query returns data, and
every panel (all eight are load-driven: end-to-end latency and TTFT, their heatmaps, running
and queued requests, generation throughput, cache hit rate) shows a non-zero value at some
point of the load.

The pod serves `meta-llama/Llama-3.1-8B-Instruct` (`--served-model-name`, the dashboard's own
default selection) with four seats (`--max-num-seqs 4`) at real time, so the load (16 clients)
queues and lasts a few seconds; streamed and whole answers alternate, and the prompts share
prefixes (radix-cache hits). Grafana's variables are resolved as Grafana resolves them: each is
a `label_values(...)` query (no "All" option), so the test asks Prometheus for the label's
values and selects the one there is; `$__rate_interval` is 1m."""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
import time
from pathlib import Path

import httpx
from http_helpers import sample_sum, sse_events
from server_proc import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "observability"))
from obs_prometheus import Prometheus, free_port, range_values, running_prometheus, substitute

FIXTURES = Path(__file__).resolve().parents[1] / "observability/fixtures"
DASHBOARD = "sglang_dashboard.json"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"
POD = ("--chip", "h100-sxm", "--engine", "sglang", "--model", "llama-3.1-8b", "--quant", "bf16",
       "--http-api", "sglang", "--enable-metrics", "--served-model-name", SERVED,
       "--max-model-len", "1024", "--max-num-seqs", "4", "--time-scale", "1.0")
# A range-query step under the 200 ms scrape interval: every scrape of a gauge is seen.
STEP = "0.1"
CLIENTS, PER_CLIENT, NEW_TOKENS = 16, 4, 32


def dashboard() -> dict:
    return json.loads((FIXTURES / DASHBOARD).read_text())


def panels(doc: dict) -> list[tuple[str, str]]:
    def walk(items):
        for p in items:
            yield p
            yield from walk(p.get("panels", []))

    return [(p["title"], t["expr"]) for p in walk(doc["panels"]) for t in p.get("targets", [])
            if t.get("expr")]


def label_values(prom: Prometheus, variable: dict) -> list[str]:
    """A `label_values(<label>)` query variable's options, as Grafana asks Prometheus."""
    found = re.fullmatch(r"label_values\((\w+)\)", variable["query"]["query"])
    assert found, variable
    return prom.api(f"label/{found.group(1)}/values")


async def drive(base: str) -> int:
    """16 concurrent clients, 64 `/generate` requests of 32 new tokens (ignore_eos), streamed
    and whole in turn, prompts in six families sharing 60-word prefixes; returns how many."""
    prefixes = [" ".join(f"family{f} word{w}" for w in range(30)) for f in range(6)]
    sent = 0

    async def worker(h: httpx.AsyncClient, w: int) -> None:
        nonlocal sent
        for j in range(PER_CLIENT):
            streaming = bool((w + j) % 2)
            r = await h.post("/generate", json={
                "text": f"{prefixes[(w + j) % 6]} question {w}.{j}",
                "sampling_params": {"max_new_tokens": NEW_TOKENS, "ignore_eos": True},
                "stream": streaming})
            assert r.status_code == 200, r.text
            if streaming:
                events = sse_events(r.text.splitlines())
                assert events[-1] == "[DONE]", events[-1]
                meta = events[-2]["meta_info"]
            else:
                meta = r.json()["meta_info"]
            assert meta["completion_tokens"] == NEW_TOKENS, meta
            sent += 1

    async with httpx.AsyncClient(base_url=base, timeout=60) as h:
        await asyncio.gather(*(worker(h, w) for w in range(CLIENTS)))
    return sent


def test_sglang_dashboard_fills_from_a_pod_under_load(tmp_path):
    port = free_port()
    server = ServerProcess(None, *POD, "--port", "0", "--http-port", str(port))
    doc = dashboard()
    with running_prometheus([f"127.0.0.1:{port}"], tmp_path) as prom, server:
        t0 = prom.wait_scraped_after(0.0)
        sent = asyncio.run(drive(server.http_url))
        assert sent == CLIENTS * PER_CLIENT
        t1 = prom.wait_scraped_after(time.time())
        # every request finished once in the histograms the latency panels read
        assert sample_sum(server.scrape(), "sglang:e2e_request_latency_seconds_count") == sent
        # The dashboard's variables: `instance` and `model_name`, each label_values(...) with
        # one value on this pod, which is what Grafana selects.
        variables = {v["name"]: label_values(prom, v) for v in doc["templating"]["list"]}
        assert variables == {"instance": [f"127.0.0.1:{port}"], "model_name": [SERVED]}
        values = {f"${name}": options[0] for name, options in variables.items()}
        values["$__rate_interval"] = "1m"
        moved: set[str] = set()
        checked = 0
        for title, expr in panels(doc):
            q = substitute(expr, values)
            series = range_values(prom, q, t0, t1, STEP)
            checked += 1
            assert series, f"{title}: no data for {q!r}"
            finite = [v for v in series if math.isfinite(v)]
            # Every query of every panel, not only one per panel, moves with the load.
            assert finite and max(finite) > 0, f"{title}: {q!r} -> {series}"
            moved.add(title)
        assert (len(moved), checked) == (8, 14), (sorted(moved), checked)
