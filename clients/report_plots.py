"""The load report's figures (matplotlib, Agg, no display), each returned as a base64 PNG.

Every latency axis that has an SLO bound draws it as a dashed red line, and every sweep point
is labelled with its offered and achieved rate, so a figure read alone says what it shows.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter, ScalarFormatter

from clients.report import RequestResult

SLO_STYLE = {"color": "tab:red", "ls": "--", "lw": 1.2}


def png_base64(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def latency_cdfs(results: list[RequestResult], slo: dict[str, float] | None = None,
                 label: str = "") -> str:
    """CDFs of TTFT, TPOT, ITL and E2E of `results` (`label` says which run they are), with
    each SLO bound as a vertical line."""
    ok = [r for r in results if r.ok]
    series = {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [r.tpot for r in ok if r.tpot is not None],
        "itl": [g for r in ok for g in r.itls()],
        "e2e": [r.e2e for r in ok],
    }
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.4))
    for ax, (name, values) in zip(axes, series.items(), strict=True):
        if values:
            x = np.sort(np.asarray(values)) * 1e3
            ax.plot(x, np.arange(1, len(x) + 1) / len(x))
        if slo and name in slo:
            ax.axvline(slo[name] * 1e3, **SLO_STYLE, label=f"SLO {slo[name] * 1e3:g} ms")
            ax.legend(fontsize=8)
        ax.set_title(f"{name.upper()} CDF")
        ax.set_xlabel("ms")
        ax.set_ylim(0, 1.01)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests")
    if label:
        fig.suptitle(label, y=1.04)
    return png_base64(fig)


def tokens_over_time(results: list[RequestResult], bins: int = 50, label: str = "") -> str:
    times = np.asarray([t for r in results if r.ok for t in r.token_times])
    fig, ax = plt.subplots(figsize=(8, 3.2))
    if times.size:
        counts, edges = np.histogram(times, bins=bins)
        width = edges[1] - edges[0]
        ax.plot((edges[:-1] + edges[1:]) / 2, counts / width if width else counts)
    ax.set_title("output tokens/s over time" + (f" ({label})" if label else ""))
    ax.set_xlabel("s since start")
    ax.set_ylabel("tokens/s")
    ax.grid(alpha=0.3)
    return png_base64(fig)


def _plain_log_axes(ax: Any) -> None:
    """Log axes labelled 1, 10, 100 (no minor labels crowding the ticks)."""
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())


def sweep_plot(points: list[dict[str, Any]], slo: dict[str, float] | None = None) -> str:
    """Achieved against offered rate (the diagonal is keeping up), then TTFT and TPOT
    percentiles against the offered rate with the SLO bounds; points labelled offered→achieved,
    the saturated one in red."""
    rates = "offered_rate" in points[0]  # else a closed-loop sweep over concurrencies
    offered = [p["offered_rate"] if rates else p["concurrency"] for p in points]
    achieved = [p["steady"]["achieved_rate"] if "steady" in p else p["requests_per_s"]
                for p in points]
    xlabel = "offered rate (req/s)" if rates else "concurrency"
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    ax = axes[0]
    if rates:
        ax.plot(offered, offered, color="grey", ls=":", lw=1, label="achieved = offered")
    ax.plot(offered, achieved, marker="o", label="achieved (steady state)")
    for p, x, y in zip(points, offered, achieved, strict=True):
        ax.annotate(f"{x:g}→{y:.1f}", (x, y), textcoords="offset points", xytext=(4, -10),
                    fontsize=7, color="tab:red" if p.get("saturated") else "black")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_axes(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("achieved rate (req/s)")
    ax.set_title("does throughput follow the offered rate?")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    for ax, key in zip(axes[1:], ("ttft", "tpot"), strict=True):
        for pct in ("p50", "p90", "p99"):
            ax.plot(offered, [p[f"{key}_s"][pct] * 1e3 for p in points], marker="o", label=pct)
        if slo and key in slo:
            ax.axhline(slo[key] * 1e3, **SLO_STYLE, label=f"SLO {slo[key] * 1e3:g} ms")
        for p, x, y in zip(points, offered, achieved, strict=True):
            ax.annotate(f"{x:g}→{y:.1f}",
                        (x, p[f"{key}_s"]["p50"] * 1e3), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log_axes(ax)
        ax.set_xlabel(f"{xlabel}; labels: {'offered' if rates else 'concurrency'}→achieved req/s")
        ax.set_ylabel("ms")
        ax.set_title(f"{key.upper()} percentiles over the sweep")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    return png_base64(fig)
