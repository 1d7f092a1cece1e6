"""Per-replica, per-pool and per-class parts of a fleet's summary (issue 16).

Why it exists: a fleet's `--json` summary keeps one deployment's keys for the whole fleet;
a planner also asks how each replica, pool and SLO class fared. `FleetStream` is the sink a
fleet run puts its results in (`sim.virtual.Records`): one `clients.report.SummaryStream` for
the fleet and one per pool and per class, each fed in the run's order, so the parts are
`clients.report.summarize` of the very sublists (a pool's p99 means what the fleet's does) and
a run of a million requests keeps none of them (memory flat with the request count). The
list-taking functions below are the same reports of results already in a list.

- `pools`: per pool (a deployment: its role, classes, replica count), the requests whose
  replica is in it, and for a prefill pool the requests it prefilled (`prefills`); a P/D
  request counts in both its pools. Latencies are those requests' client-side TTFT / TPOT /
  E2E; `usd_per_hour` is its replicas' rental cost (the catalogue's price per chip-hour).
- `classes`: per SLO class (only when some request has one), its requests, errors and
  latencies; refused requests (the router's admission) are errors of their class.
- per replica: the requests it served and refused, and those it prefilled for another (P/D).
- `kv_offload` (one deployment or a fleet): what vLLM's CPU offloading tiers did.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from clients.report import RequestResult, SummaryStream
from sim.pools import Pool

LATENCIES = ("ttft_s", "tpot_s", "e2e_s")


class FleetStream:
    """The results of a fleet run of `n` replicas in `pools`, summarised as they end."""

    def __init__(self, pools: Sequence[Pool], n: int, slo: dict[str, float] | None = None,
                 keep: bool = False) -> None:
        self.fleet = SummaryStream(slo, keep=keep)
        self._pools = [(p, frozenset(p.replicas), SummaryStream(itl=False)) for p in pools]
        self._pool_prefills = [0] * len(pools)
        self._classes: dict[str, SummaryStream] = {}
        self.served, self.refused, self.prefills = [0] * n, [0] * n, [0] * n

    @classmethod
    def of(cls, results: Iterable[RequestResult], pools: Sequence[Pool] = (),
           n: int = 0) -> FleetStream:
        out = cls(pools, n)
        for r in results:
            out.append(r)
        return out

    def append(self, r: RequestResult) -> None:
        self.fleet.add(r)
        ok = r.error is None
        for i, (_, mine, part) in enumerate(self._pools):
            if r.replica in mine or r.prefill_replica in mine:
                part.add(r)
            if ok and r.prefill_replica in mine:
                self._pool_prefills[i] += 1
        part = self._classes.get(r.slo_class)
        if part is None:
            part = self._classes[r.slo_class] = SummaryStream(itl=False)
        part.add(r)
        if 0 <= r.replica < len(self.served):
            (self.served if ok else self.refused)[r.replica] += 1
        if ok and r.prefill_replica is not None and r.prefill_replica < len(self.prefills):
            self.prefills[r.prefill_replica] += 1

    def pool_reports(self, cores: Sequence) -> list[dict[str, Any]]:
        out = []
        for (p, _, part), prefills in zip(self._pools, self._pool_prefills, strict=True):
            row = {"name": p.name, "role": p.role, "classes": list(p.classes),
                   "replicas": len(p.replicas), **_part(part)}
            if p.role == "prefill":
                row["prefills"] = prefills
            row["usd_per_hour"] = sum(cores[k].dollars_per_s for k in p.replicas) * 3600
            out.append(row)
        return out

    def class_reports(self) -> dict[str, dict[str, Any]]:
        """Per SLO class, by name; {} when no request has a class."""
        if not any(self._classes.keys()):
            return {}
        return {n or "untagged": _part(self._classes[n]) for n in sorted(self._classes)}


def _part(stream: SummaryStream) -> dict[str, Any]:
    s = stream.summary()
    return {"requests": s["requests"], "errors": sum(s["errors"].values()),
            **{k: s[k] for k in LATENCIES}}


def pool_reports(pools: Sequence[Pool], cores: Sequence,
                 results: Sequence[RequestResult]) -> list[dict[str, Any]]:
    return FleetStream.of(results, pools).pool_reports(cores)


def prefills_per_replica(records: Sequence[RequestResult], n: int) -> list[int]:
    """How many requests each of `n` replicas prefilled for a decode replica (P/D)."""
    return FleetStream.of(records, (), n).prefills


def class_reports(results: Sequence[RequestResult]) -> dict[str, dict[str, Any]]:
    """Per SLO class, by name; {} when no request has a class."""
    return FleetStream.of(results).class_reports()


def pooling_report(pooling: bool, joules: float, dollars: float,
                   prompt_tokens: int) -> dict[str, Any]:
    """`{"pooling": ...}` for a run of embedding models (docs/EMBEDDINGS.md), or {}: nothing
    is generated, so the run is priced per million input tokens."""
    if not pooling or not prompt_tokens:
        return {}
    per = 1e6 / prompt_tokens
    return {"pooling": {"joules_per_m_input_tok": joules * per,
                        "usd_per_m_input_tok": dollars * per}}


def offload_report(scheds: Sequence[Any]) -> dict[str, Any]:
    """`{"kv_offload": ...}` over these schedulers' CPU offloading tiers (docs/KV_OFFLOAD.md),
    or {} when none has one: prompt tokens loaded instead of prefilled, the loads, their bytes
    and seconds on the host links, the bytes stored and the stores that found no room."""
    tiers = [s.offload.stats for s in scheds if s.offload is not None]
    if not tiers:
        return {}
    return {"kv_offload": {
        "hit_tokens": sum(s.stats.host_prefix_cache_hits for s in scheds),
        "loads": sum(t.loads for t in tiers), "load_bytes": sum(t.load_bytes for t in tiers),
        "load_seconds": sum(t.load_seconds for t in tiers),
        "store_bytes": sum(t.store_bytes for t in tiers),
        "allocation_failures": sum(t.allocation_failures for t in tiers)}}
