"""A real Prometheus (and promtool) for the observability tests.

The binaries come from Debian's `prometheus` package, fetched into `.cache/prometheus/` by
`scripts/fetch_prometheus.sh` (`make test` runs it first). Prometheus always runs on
127.0.0.1 with its own config and storage in a temporary folder, never as a system service.
A missing binary fails the test with instructions: these tests never skip silently.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".cache" / "prometheus" / "usr" / "bin"
T = TypeVar("T")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy


def binary(name: str) -> Path:
    path = BIN / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `scripts/fetch_prometheus.sh` (or `make test`, "
                    "which runs it) to fetch Debian's prometheus package into .cache/")
    return path


def http_get(url: str, timeout: float = 5.0) -> str:
    with _OPENER.open(url, timeout=timeout) as r:
        return r.read().decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition: Callable[[], T | None], timeout: float, what: str,
               interval: float = 0.05) -> T:
    """Poll `condition()` until it returns something truthy; fail after `timeout` seconds.
    (Polling with a deadline: no fixed sleep stands in for a condition.)"""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except OSError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


class Prometheus:
    def __init__(self, port: int, proc: subprocess.Popen) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.proc = proc

    def api(self, path: str, **params: str) -> dict:
        query = urllib.parse.urlencode(params)
        body = json.loads(http_get(f"{self.url}/api/v1/{path}?{query}"))
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Instant query; returns the result vector (fails on an error or a non-vector)."""
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        data = self.api("query", **params)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return data["result"]

    def scalar(self, expr: str, at: float | None = None) -> float:
        result = self.query(expr, at)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    def last_scrape(self) -> float:
        """Unix time of the newest scrape of every target (0 if one was never scraped)."""
        targets = self.api("targets")["activeTargets"]
        stamps = [t.get("lastScrape", "") for t in targets if t.get("health") == "up"]
        if not targets or len(stamps) < len(targets):
            return 0.0
        return min(_parse_time(s) for s in stamps)

    def wait_scraped_after(self, t: float, timeout: float = 15.0) -> float:
        """Wait until every target has been scraped (successfully) after time `t`."""
        return wait_until(lambda: (s := self.last_scrape()) > t and s, timeout,
                          "Prometheus to scrape every target")


def _parse_time(stamp: str) -> float:
    # RFC 3339 with nanoseconds, e.g. 2026-01-01T00:00:00.123456789Z
    head, _, frac = stamp.rstrip("Z").partition(".")
    base = datetime.fromisoformat(head + "+00:00").timestamp()
    frac = frac.split("+")[0].split("-")[0]
    return base + (float("0." + frac) if frac else 0.0)


@contextmanager
def running_prometheus(targets: list[str], folder: Path,
                       scrape_interval: str = "200ms") -> Iterator[Prometheus]:
    """Start Prometheus on 127.0.0.1 scraping `targets` (host:port); stop it afterwards."""
    exe = binary("prometheus")
    config = folder / "prometheus.yml"
    config.write_text(
        "global:\n"
        f"  scrape_interval: {scrape_interval}\n"
        f"  scrape_timeout: {scrape_interval}\n"
        "scrape_configs:\n"
        "  - job_name: doppelchip\n"
        f"    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
    )
    port = free_port()
    log = (folder / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [str(exe), f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    prom = Prometheus(port, proc)
    try:
        wait_until(lambda: proc.poll() is not None or "Ready" in http_get(f"{prom.url}/-/ready"),
                   20, "Prometheus to start")
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited: {(folder / 'prometheus.log').read_text()[-2000:]}")
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def finite_values(result: list[dict]) -> list[float]:
    return [float(r["value"][1]) for r in result if math.isfinite(float(r["value"][1]))]


def substitute(expr: str, values: dict[str, str]) -> str:
    """A dashboard query with Grafana's variables replaced (the longest names first: `$__range`
    before `$__r...`); no `$` may be left."""
    for key in sorted(values, key=len, reverse=True):
        expr = expr.replace(key, values[key])
    assert "$" not in expr, expr
    return expr


def range_values(prom: Prometheus, expr: str, start: float, end: float,
                 step: str = "0.5") -> list[float]:
    """Every value of every series `expr` gives over [start, end] (a range query)."""
    data = prom.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}",
                    step=step)
    assert data["resultType"] == "matrix", (expr, data["resultType"])
    return [float(v) for series in data["result"] for _, v in series["values"]]
