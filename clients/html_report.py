"""A self-contained HTML report of a load run (or a sweep): the summary and its plots.

Plots are drawn with matplotlib (Agg, no display) and embedded as base64 PNGs, so the report
is one file that opens anywhere: latency CDFs (TTFT, TPOT, ITL, E2E), output tokens/s over
time, and — for a sweep — latency percentiles against achieved throughput.
"""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from clients.report import RequestResult


def png_base64(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def latency_cdfs(results: list[RequestResult]) -> str:
    ok = [r for r in results if r.ok]
    series = {
        "TTFT": [r.ttft for r in ok if r.ttft is not None],
        "TPOT": [r.tpot for r in ok if r.tpot is not None],
        "ITL": [g for r in ok for g in r.itls()],
        "E2E": [r.e2e for r in ok],
    }
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.4))
    for ax, (name, values) in zip(axes, series.items(), strict=True):
        if values:
            x = np.sort(np.asarray(values)) * 1e3
            ax.plot(x, np.arange(1, len(x) + 1) / len(x))
        ax.set_title(f"{name} CDF")
        ax.set_xlabel("ms")
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests")
    return png_base64(fig)


def tokens_over_time(results: list[RequestResult], bins: int = 50) -> str:
    times = np.asarray([t for r in results if r.ok for t in r.token_times])
    fig, ax = plt.subplots(figsize=(8, 3.2))
    if times.size:
        counts, edges = np.histogram(times, bins=bins)
        width = edges[1] - edges[0]
        ax.plot((edges[:-1] + edges[1:]) / 2, counts / width if width else counts)
    ax.set_title("output tokens/s over time")
    ax.set_xlabel("s since start")
    ax.set_ylabel("tokens/s")
    ax.grid(alpha=0.3)
    return png_base64(fig)


def sweep_plot(points: list[dict[str, Any]]) -> str:
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
    x = [p["output_tokens_per_s"] for p in points]
    for key, ax in zip(("ttft_s", "e2e_s"), axes, strict=True):
        for pct in ("p50", "p90", "p99"):
            ax.plot(x, [p[key][pct] * 1e3 for p in points], marker="o", label=pct)
        ax.set_title(f"{key[:-2].upper()} vs throughput")
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel("ms")
        ax.grid(alpha=0.3)
        ax.legend()
    return png_base64(fig)


def page(title: str, figures: list[tuple[str, str]], data_heading: str, data: Any) -> str:
    """One self-contained HTML document: a title, (heading, base64 PNG) figures, and the data
    they were drawn from as JSON."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    for heading, png in figures:
        body.append(f"<h2>{html.escape(heading)}</h2>"
                    f'<img alt="{html.escape(heading)}" src="data:image/png;base64,{png}">')
    table = json.dumps(data, indent=1, default=str)
    body.append(f"<h2>{html.escape(data_heading)}</h2><pre>{html.escape(table)}</pre>")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:2em}img{max-width:100%}</style>"
            f"</head><body>{''.join(body)}</body></html>")


def render(summary: dict[str, Any], results: list[RequestResult],
           sweep: list[dict[str, Any]] | None = None, title: str = "doppelchip load") -> str:
    """The whole report as one HTML document."""
    figures = [("Latency distributions", latency_cdfs(results)),
               ("Throughput over time", tokens_over_time(results))]
    if sweep:
        figures.insert(0, ("Latency vs throughput over the sweep", sweep_plot(sweep)))
    return page(title, figures, "Summary", summary)
