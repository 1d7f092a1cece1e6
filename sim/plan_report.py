"""The HTML report of `doppelchip plan`: the conclusions the terminal prints (the same
lines), the cost-vs-latency plot of every candidate tried (the frontier drawn, the winner
marked, the SLO bound as a line when the frontier's metric has one) and formatted tables of
the winner, the runners-up, the frontier, every candidate simulated and what was pruned."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from clients.html_report import page, png_base64, table
from sim.plan_fleet import label as fleet_label

COLUMNS = ["fleet", "$/hour", "$/Mtok", "chips", "TTFT p99 ms", "TPOT p99 ms", "E2E p99 ms",
           "goodput", "meets SLO", "why not"]


def _row(r: dict[str, Any]) -> list[Any]:
    lat = r.get("latency")
    ms = (lambda k: lat[k] * 1e3) if lat else (lambda k: None)
    return [fleet_label(r), r["usd_per_hour"], r.get("usd_per_mtok"),
            r["chips"], ms("ttft_p99"), ms("tpot_p99"), ms("e2e_p99"),
            r.get("goodput_fraction"), r["meets_slo"], "; ".join(r["misses"]) or "-"]


def frontier_plot(plan: dict[str, Any]) -> str:
    """Price against the frontier's latency for every candidate simulated."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    recs = [r for r in plan["candidates"] if "frontier_latency_s" in r]
    for meets, colour, label in ((True, "tab:green", "meets the SLO"),
                                 (False, "tab:red", "misses the SLO")):
        pts = [r for r in recs if r["meets_slo"] == meets]
        ax.scatter([r["usd_per_hour"] for r in pts], [r["frontier_latency_s"] * 1e3 for r in pts],
                   c=colour, label=label, s=24, alpha=0.7)
    front = plan["frontier"]
    if front:
        ax.step([r["usd_per_hour"] for r in front], [r["frontier_latency_s"] * 1e3 for r in front],
                where="post", c="tab:blue", label="Pareto frontier")
    w = plan["winner"]
    if w:
        ax.scatter([w["usd_per_hour"]], [w["frontier_latency_s"] * 1e3], marker="*", s=240,
                   c="gold", edgecolors="k", zorder=5,
                   label=f"winner: {fleet_label(w)}")
    metric = plan["frontier_metric"]
    bound = plan.get("frontier_bound_s")
    if bound:
        ax.axhline(bound * 1e3, ls="--", c="grey", label=f"SLO {metric} {bound * 1e3:g} ms")
    ax.set_xlabel("fleet price ($/hour)")
    ax.set_ylabel(f"{metric} (ms)")
    ax.set_title(f"cost vs {metric} at {plan['rate']:g} req/s")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return png_base64(fig)


def render(plan: dict[str, Any], conclusions: list[str]) -> str:
    tables = []
    if plan["winner"]:
        tables.append(("Winner", table(COLUMNS, [_row(plan["winner"])], "winner")))
        tables.append(("Winner's fleet file", f"<pre>{_esc(plan['winner']['fleet'])}</pre>"))
        tables.append(("Runners-up", table(COLUMNS, [_row(r) for r in plan["runners_up"]],
                                           "runners-up")))
        tables.append(("Pareto frontier", table(COLUMNS, [_row(r) for r in plan["frontier"]],
                                                "frontier")))
    tables.append(("Every candidate simulated", table(
        COLUMNS, [_row(r) for r in plan["candidates"]], "candidates")))
    tables.append(("Configs pruned by the analytic model", table(
        ["deployment", "why"], [[p["deployment"], p["why"]] for p in plan["pruned"]],
        "pruned")))
    return page(f"doppelchip plan: {plan['slo']} at {plan['rate']:g} req/s",
                [(f"Cost vs {plan['frontier_metric']}", frontier_plot(plan))], tables,
                conclusions)


def _esc(text: str) -> str:
    import html

    return html.escape(text)
