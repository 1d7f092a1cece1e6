"""Read a doppelchip server's Prometheus endpoint: energy and cost counters of a deployment,
so a load test against a real server reports joules and dollars per million tokens too."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

COUNTERS = ("doppelchip_energy_joules", "doppelchip_cost_dollars")


def scrape(url: str, deployment: str, timeout: float = 5.0) -> dict[str, float]:
    """{counter name: value} of `deployment` (loopback URLs only)."""
    if not url.startswith(("http://127.0.0.1:", "http://localhost:", "http://[::1]:")):
        raise ValueError(f"metrics are only read from loopback, not {url!r}")
    with urllib.request.urlopen(url, timeout=timeout) as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name in COUNTERS:
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("deployment") == deployment:
                    out[family.name] = sample.value
    return out


def per_million_tokens(before: dict[str, float], after: dict[str, float],
                       output_tokens: int) -> dict[str, float]:
    """joules_per_mtok and usd_per_mtok from two scrapes around a load."""
    if not output_tokens or not before or not after:
        return {}
    scale = 1e6 / output_tokens
    return {
        "joules_per_mtok": (after["doppelchip_energy_joules"]
                            - before["doppelchip_energy_joules"]) * scale,
        "usd_per_mtok": (after["doppelchip_cost_dollars"]
                         - before["doppelchip_cost_dollars"]) * scale,
    }
