"""A self-contained HTML report of a load run (or a sweep), for people: it opens with the
conclusions (the same lines the terminal prints: highest rate meeting the SLO, its cost, the
bottleneck at saturation), then the figures (clients.report_plots, embedded as base64 PNGs so
the report is one file that opens anywhere), then formatted tables — numbers rounded to what
they mean, never raw JSON.
"""

from __future__ import annotations

import html
from typing import Any

from clients.report import RequestResult
from clients.report_plots import latency_cdfs, png_base64, sweep_plot, tokens_over_time

__all__ = ["fmt", "page", "png_base64", "render", "table"]

STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1400px}img{max-width:100%}"
         "#conclusion{background:#eef6ee;border-left:4px solid #2a7;padding:.6em 1em}"
         "#conclusion li{margin:.2em 0;white-space:pre-wrap;font-family:monospace}"
         "table{border-collapse:collapse;font-size:13px}"
         "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
         "th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}")


def fmt(value: Any) -> str:
    """A cell: floats to 4 significant digits (no 16-digit floats), dicts as k=v pairs."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else ("yes" if value else "no")
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={fmt(v)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v) for v in value) or "-"
    return str(value)


def table(header: list[str], rows: list[list[Any]], table_id: str = "") -> str:
    ident = f' id="{html.escape(table_id)}"' if table_id else ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def page(title: str, figures: list[tuple[str, str]], tables: list[tuple[str, str]],
         conclusions: list[str] | None = None) -> str:
    """One self-contained HTML document: the title, the conclusions (a list of sentences),
    (heading, base64 PNG) figures and (heading, table HTML) tables."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    if conclusions:
        items = "".join(f"<li>{html.escape(c)}</li>" for c in conclusions)
        body.append(f'<section id="conclusion"><h2>Conclusion</h2><ul>{items}</ul></section>')
    for heading, png in figures:
        body.append(f"<h2>{html.escape(heading)}</h2>"
                    f'<img alt="{html.escape(heading)}" src="data:image/png;base64,{png}">')
    for heading, markup in tables:
        body.append(f"<h2>{html.escape(heading)}</h2>{markup}")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style>"
            f"</head><body>{''.join(body)}</body></html>")


def _sweep_table(points: list[dict[str, Any]]) -> str:
    rates = "offered_rate" in points[0]
    header = (["offered req/s", "achieved req/s", "achieved/offered"] if rates
              else ["concurrency", "req/s"])
    header += ["output tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "E2E p50 ms",
               "goodput", "requests", "saturated", "$/Mtok", "errors"]
    rows = []
    for p in points:
        st = p.get("steady", {})
        good = st.get("goodput_fraction", p.get("goodput", {}).get("fraction"))
        rows.append(([p["offered_rate"], st["achieved_rate"], st["achieved_over_offered"]]
                     if rates else [p["concurrency"], p["requests_per_s"]]) + [
            p["output_tokens_per_s"], p["ttft_s"]["p50"] * 1e3, p["ttft_s"]["p99"] * 1e3,
            p["tpot_s"]["p50"] * 1e3, p["e2e_s"]["p50"] * 1e3,
            f"{good:.0%}" if good is not None else "-", p.get("num_requests", p["requests"]),
            p.get("saturated", False), p.get("usd_per_mtok"), sum(p["errors"].values())])
    return table(header, rows, "sweep")


def _summary_table(summary: dict[str, Any]) -> str:
    rows = [[k, v] for k, v in summary.items()
            if k not in ("sweep", "warnings", "server_counters", "requests_per_point")]
    return table(["", "value"], rows, "summary")


def render(summary: dict[str, Any], results: list[RequestResult],
           sweep: list[dict[str, Any]] | None = None, title: str = "doppelchip load",
           conclusions: list[str] | None = None) -> str:
    """The whole report as one HTML document; `results` are the requests of the single run, or
    of the sweep's last point (the figures say which)."""
    slo = summary.get("slo")
    label = ""
    if sweep:
        last = sweep[-1]
        label = (f"at {last['offered_rate']:g} req/s offered" if "offered_rate" in last
                 else f"at concurrency {last['concurrency']:g}") + ", the sweep's last point"
    figures = [(f"Latency distributions{' ' + label if label else ''}",
                latency_cdfs(results, slo, label)),
               (f"Throughput over time{' ' + label if label else ''}",
                tokens_over_time(results, label=label))]
    tables = []
    if sweep:
        figures.insert(0, ("Achieved rate and latency over the sweep", sweep_plot(sweep, slo)))
        tables.append(("Sweep points", _sweep_table(sweep)))
        tables.append(("Sweep summary", _summary_table(summary)))
    else:
        tables.append(("Summary", _summary_table(summary)))
    return page(title, figures, tables, conclusions)
