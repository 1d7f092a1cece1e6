"""The report over time as terminal text (issue 16): the autoscaling line of each deployment
and a short timeline table, from the summary's `autoscaling` and `timeline` keys (computed
by sim/timeline.py); plain dicts in, text out, so the HTML report says the same."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def format_timeline(rows: Sequence[dict[str, Any]], max_rows: int = 24) -> str:
    """A short terminal table: every row if few, else `max_rows` evenly spaced ones."""
    if not rows:
        return ""
    step = max(1, -(-len(rows) // max_rows))
    shown = list(rows[::step])
    head = (f"{'t (s)':>8} {'prov':>4} {'ready':>5} {'wait':>5} {'run':>5} {'kv %':>5} "
            f"{'arr':>5} {'ttft p50':>9} {'ttft p99':>9} {'$':>9}")
    every = f"{rows[1]['t'] - rows[0]['t']:g} s intervals" if len(rows) > 1 else "1 interval"
    shown_of = f", 1 row in {step} shown" if step > 1 else ""
    lines = [f"timeline        {len(rows)} × {every}{shown_of}", head]

    def ms(v: float | None) -> str:
        return f"{v * 1e3:7.1f}ms" if v is not None else f"{'-':>9}"

    for r in shown:
        lines.append(f"{r['t']:8.0f} {r['provisioned']:4d} {r['ready']:5d} {r['waiting']:5d} "
                     f"{r['running']:5d} {r['kv_usage'] * 100:5.1f} {r['arrivals']:5d} "
                     f"{ms(r['ttft_p50_s'])} {ms(r['ttft_p99_s'])} {r['dollars']:9.4f}")
    return "\n".join(lines)


def format_scaling(summary: dict[str, Any]) -> str:
    """One line per autoscaled deployment: its policy, cold start, scale events, billing."""
    lines = []
    for name, a in summary.get("autoscaling", {}).items():
        p = a["policy"]
        if p is None:
            continue
        events = ", ".join(f"{e['from']}→{e['to']} at {e['t']:.0f} s" for e in a["events"][:8])
        more = f" (+{len(a['events']) - 8} more)" if len(a["events"]) > 8 else ""
        lines.append(f"autoscaling     {name}: {p['metric']} target {p['target']:g}, "
                     f"replicas {p['min']}..{p['max']}, cold start {a['boot_s']:.1f} s; "
                     f"{events or 'no scaling'}{more}; "
                     f"{a['replica_seconds']:.0f} replica-seconds billed")
    return "\n".join(lines)
