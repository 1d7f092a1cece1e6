"""The HTML report of a simulate run over time (issue 16; docs/AUTOSCALING.md): replicas
provisioned and ready, the queue, TTFT of the requests arriving in each interval, and dollars
so far, on one time axis, with each scale event and each replica's boot drawn as a band —
the cold-start dip (TTFT up while a new replica boots) is where the bands are. It opens with
the conclusions the terminal prints, then the terminal's summary, replicas, pools and SLO
classes as tables, and ends with the timeline as a table (a run without `--timeline` or an
autoscaler has no timeline: its page is the conclusion and the tables).
"""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt

from clients.html_report import page, table
from clients.report_plots import png_base64
from clients.timeline_text import format_scaling  # the same sentences as the terminal


def timeline_plot(rows: list[dict[str, Any]], boots: list[tuple[float, float]]) -> str:
    """Four stacked panels sharing the time axis; `boots` are (start, end) of cold starts."""
    t = [r["t"] for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(10, 9), sharex=True)
    ax = axes[0]
    ax.step(t, [r["provisioned"] for r in rows], where="post", label="provisioned (billed)")
    ax.step(t, [r["ready"] for r in rows], where="post", label="ready (routed to)")
    ax.set_ylabel("replicas")
    ax = axes[1]
    ax.plot(t, [r["waiting"] for r in rows], label="waiting")
    ax.plot(t, [r["running"] for r in rows], label="running")
    ax.set_ylabel("requests")
    ax = axes[2]
    for key, label in (("ttft_p50_s", "TTFT p50"), ("ttft_p99_s", "TTFT p99")):
        ax.plot(t, [r[key] * 1e3 if r[key] is not None else float("nan") for r in rows],
                marker=".", label=f"{label} of arrivals in the interval")
    ax.set_ylabel("ms")
    ax = axes[3]
    ax.plot(t, [r["dollars"] for r in rows], label="dollars so far")
    ax.set_ylabel("$")
    ax.set_xlabel("emulated seconds since start")
    for i, ax in enumerate(axes):
        for a, b in boots:
            ax.axvspan(a, b, color="tab:orange", alpha=0.15,
                       label="replica booting (cold start)" if i == 0 and (a, b) == boots[0]
                       else None)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[0].set_title("the fleet over time")
    return png_base64(fig)


def boots_of(summary: dict[str, Any]) -> list[tuple[float, float]]:
    """(start, end) of every scale-up's cold start."""
    out = []
    for a in summary.get("autoscaling", {}).values():
        for e in a["events"]:
            if e["to"] > e["from"]:
                out.append((e["t"], e["t"] + a["boot_s"]))
    return out


def conclusions(summary: dict[str, Any]) -> list[str]:
    lines = [f"{summary['deployment']}: {summary['requests']} requests in "
             f"{summary['duration_s']:.0f} s (emulated), TTFT p99 "
             f"{summary['ttft_s']['p99'] * 1e3:.1f} ms, "
             f"${summary['usd_per_mtok']:.4g} per million output tokens"]
    lines += [line.removeprefix("autoscaling").strip()
              for line in format_scaling(summary).splitlines()]
    return lines


def summary_table(lines: list[str]) -> str:
    """The terminal's `key   value` summary lines as two columns."""
    return table(["", "value"], [[line[:16].strip(), line[16:].strip()] for line in lines],
                 "summary")


def fleet_tables(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """Per replica, per pool and per SLO class, as the terminal's tables."""
    out = []
    if summary.get("replicas"):
        pd = any("prefills" in r for r in summary["replicas"])
        header = ["replica", "deployment", "chip", "requests", "errors"]
        header += ["prefilled"] if pd else []
        body = [[r["name"], r["deployment"], r["chip"], r["requests"], r["errors"]]
                + ([r["prefills"]] if pd else []) + [f"{r['prefix_cache_hit_rate']:.1%}"]
                for r in summary["replicas"]]
        out.append(("Replicas", table([*header, "prefix cache hit"], body, "replicas")))
    lat = ["TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms"]

    def ms(r: dict[str, Any]) -> list[float]:
        return [r[k][q] * 1e3 for k in ("ttft_s", "tpot_s") for q in ("p50", "p99")]

    if summary.get("pools"):
        body = [[p["name"], p["role"], ",".join(p["classes"]) or "any", p["replicas"],
                 p["requests"], p["errors"], *ms(p), p["usd_per_hour"]]
                for p in summary["pools"]]
        out.append(("Pools", table(["pool", "role", "classes", "replicas", "requests", "errors",
                                    *lat, "$/h"], body, "pools")))
    if summary.get("classes"):
        body = [[name, c["requests"], c["errors"], *ms(c)]
                for name, c in summary["classes"].items()]
        out.append(("SLO classes", table(["class", "requests", "errors", *lat], body,
                                         "classes")))
    return out


def render_timeline(summary: dict[str, Any], lines: list[str] = ()) -> str:
    """The whole report as one HTML document (figures embedded); `lines`: the summary lines
    the terminal prints (doppelchip.simulate_format), shown as the summary table."""
    rows = summary.get("timeline") or []
    figures = [("Replicas, queue, latency and dollars over time",
                timeline_plot(rows, boots_of(summary)))] if rows else []
    header = ["t s", "provisioned", "ready", "waiting", "running", "KV %", "arrivals",
              "TTFT p50 ms", "TTFT p99 ms", "$ so far"]
    body = [[r["t"], r["provisioned"], r["ready"], r["waiting"], r["running"],
             r["kv_usage"] * 100, r["arrivals"],
             None if r["ttft_p50_s"] is None else r["ttft_p50_s"] * 1e3,
             None if r["ttft_p99_s"] is None else r["ttft_p99_s"] * 1e3, r["dollars"]]
            for r in rows]
    tables = [("Summary", summary_table(list(lines)))] if lines else []
    tables += fleet_tables(summary)
    tables += [("Timeline", table(header, body, "timeline"))] if rows else []
    return page(f"doppelchip simulate: {summary['deployment']}", figures, tables,
                conclusions(summary))
