"""Per-pool and per-class parts of a fleet's summary (issue 16).

Why it exists: a fleet's `--json` summary keeps one deployment's keys for the whole fleet;
a planner also asks how each pool and each SLO class fared. Both are computed here from the
same per-request results the fleet summary is (`clients.report.RequestResult`), with
`clients.report.summarize`'s percentiles, so a pool's p99 means what the fleet's does.

- `pools`: per pool (a deployment: its role, classes, replica count), the requests whose
  replica is in it, and for a prefill pool the requests it prefilled (`prefills`); a P/D
  request counts in both its pools. Latencies are those requests' client-side TTFT / TPOT /
  E2E; `usd_per_hour` is its replicas' rental cost (the catalogue's price per chip-hour).
- `classes`: per SLO class (only when some request has one), its requests, errors and
  latencies; refused requests (the router's admission) are errors of their class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clients.report import RequestResult, summarize
from sim.pools import Pool

LATENCIES = ("ttft_s", "tpot_s", "e2e_s")


def _part(results: list[RequestResult]) -> dict[str, Any]:
    s = summarize(results)
    errors = sum(s["errors"].values())
    return {"requests": s["requests"], "errors": errors,
            **{k: s[k] for k in LATENCIES}}


def pool_reports(pools: Sequence[Pool], cores: Sequence,
                 results: Sequence[RequestResult]) -> list[dict[str, Any]]:
    out = []
    for p in pools:
        mine = set(p.replicas)
        served = [r for r in results if r.replica in mine or r.prefill_replica in mine]
        row = {"name": p.name, "role": p.role, "classes": list(p.classes),
               "replicas": len(p.replicas), **_part(served)}
        if p.role == "prefill":
            row["prefills"] = sum(r.prefill_replica in mine and r.error is None
                                  for r in results)
        row["usd_per_hour"] = sum(cores[k].dollars_per_s for k in p.replicas) * 3600
        out.append(row)
    return out


def prefills_per_replica(records: Sequence[RequestResult], n: int) -> list[int]:
    """How many requests each of `n` replicas prefilled for a decode replica (P/D)."""
    counts = [0] * n
    for rec in records:
        if rec.prefill_replica is not None and rec.error is None:
            counts[rec.prefill_replica] += 1
    return counts


def class_reports(results: Sequence[RequestResult]) -> dict[str, dict[str, Any]]:
    """Per SLO class, by name; {} when no request has a class."""
    if not any(r.slo_class for r in results):
        return {}
    names = sorted({r.slo_class for r in results})
    return {n or "untagged": _part([r for r in results if r.slo_class == n]) for n in names}
