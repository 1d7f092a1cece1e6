"""vLLM's overview dashboard's HTTP panels fill: a real Prometheus scrapes a doppelchip under
HTTP load, and every panel query of the committed `vllm_overview.json` that reads the HTTP
series (`http_requests_total`, `http_request_duration_seconds`) returns data."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
from conftest import TEST_FLEET
from server_proc import ServerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "observability"))
from obs_prometheus import finite_values, free_port, running_prometheus

FIXTURE = Path(__file__).resolve().parents[1] / "observability/fixtures/vllm_overview.json"


def http_panels() -> list[tuple[str, str]]:
    def walk(panels):
        for p in panels:
            yield p
            yield from walk(p.get("panels", []))

    doc = json.loads(FIXTURE.read_text())
    return [(p["title"], t["expr"]) for p in walk(doc["panels"]) for t in p.get("targets", [])
            if "http_request" in t.get("expr", "")]


def load(base: str, i: int) -> None:
    with httpx.Client(base_url=base, timeout=30) as h:
        for j in range(6):
            assert h.post("/v1/completions", json={"prompt": f"dash {i}.{j}",
                                                   "max_tokens": 4}).status_code == 200
            assert h.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "stream": True}).status_code == 200
        assert h.post("/v1/completions", json={"prompt": "x", "max_tokens": 0}).status_code == 400


def test_overview_http_panels_return_data(tmp_path):
    panels = http_panels()
    assert len(panels) == 4  # 5xx ratio, by status, by endpoint, mean duration by endpoint
    port = free_port()
    server = ServerProcess(TEST_FLEET, "--port", "0", "--http-port", str(port))
    with running_prometheus([f"127.0.0.1:{port}"], tmp_path) as prom, server:
        prom.wait_scraped_after(0.0)
        for i in range(2):  # two batches with a scrape between: rate() sees an increase
            load(server.http_url, i)
            t = prom.wait_scraped_after(time.time())
        for title, expr in panels:
            q = (expr.replace("$job", ".*").replace("$instance", ".*")
                 .replace("$__rate_interval", "1m"))
            values = finite_values(prom.query(q, t))
            assert values, title
            if "5xx" not in title:  # no request failed: that ratio is 0
                assert max(values) > 0, title
        handlers = {r["metric"]["handler"] for r in prom.query(
            'sum by (handler) (http_requests_total{job="doppelchip"})', t)}
        assert {"/v1/completions", "/v1/chat/completions"} <= handlers
        statuses = {r["metric"]["status"] for r in prom.query(
            'sum by (status) (http_requests_total{job="doppelchip"})', t)}
        assert statuses == {"2xx", "4xx"}
