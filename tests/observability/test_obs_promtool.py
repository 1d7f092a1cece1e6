"""promtool (Debian's prometheus package, see obs_prometheus) lints a scrape taken after a load,
and checks and unit-tests the Prometheus config and rules in deploy/prometheus/."""

from __future__ import annotations

import asyncio
import subprocess
import urllib.request

from obs_prometheus import ROOT, binary, http_get

# What promtool may say, and why it is not ours to fix: vLLM's names (kept verbatim so vLLM
# dashboards and routers work) contain ':', and vLLM's per-step histogram is called
# `vllm:iteration_tokens_total` although it is not a counter.
ALLOWED = ("metric names should not contain ':'",
           'vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix')


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary("promtool")), *args], input=stdin, capture_output=True,
                          text=True, cwd=ROOT / "deploy" / "prometheus", timeout=60)


async def test_promtool_check_metrics_after_load(server, client):
    async def one(deployment: str, n: int) -> None:
        [c async for c in client.generate("lint me", deployment=deployment, max_tokens=n,
                                          ignore_eos=True)]

    await asyncio.gather(*(one("fast", 8) for _ in range(4)), one("slow", 2))
    text = await asyncio.to_thread(http_get, f"http://127.0.0.1:{server.metrics_port}/metrics")
    assert "vllm:time_to_first_token_seconds_count" in text  # the load is in the scrape
    result = await asyncio.to_thread(promtool, "check", "metrics", stdin=text)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    unexpected = [p for p in problems if not any(a in p for a in ALLOWED)]
    assert unexpected == [], unexpected
    assert any("should not contain ':'" in p for p in problems)  # promtool did lint the scrape
    doppel = [p for p in problems if p.startswith("doppelchip_")]
    assert doppel == []


def test_prometheus_config_and_rules():
    config = promtool("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr
    rules = promtool("test", "rules", "rules_test.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "SUCCESS" in rules.stdout


async def test_colons_survive_an_openmetrics_accept_header(server):
    """Prometheus asks for OpenMetrics; vLLM's names must still arrive with their ':'."""

    def scrape() -> tuple[str, str]:
        req = urllib.request.Request(
            f"http://127.0.0.1:{server.metrics_port}/metrics",
            headers={"Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=5) as r:
            return r.headers["Content-Type"], r.read().decode()

    content_type, text = await asyncio.to_thread(scrape)
    assert content_type.startswith("text/plain; version=0.0.4")
    assert "\nvllm:num_requests_running{" in text and "vllm_num_requests" not in text
