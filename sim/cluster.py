"""Virtual-time clusters: N replicas, each an ordinary `EngineCore`, on one shared clock
behind a router (issue 16; docs/LOAD.md).

A replica is one copy of a deployment (`EngineOptions.replicas` copies each; replicas of
different deployments — different chips, engines — may share a pool). The event loop is the
one `run_virtual` uses (`sim.virtual.run_cluster`): whichever replica's step ends
first is advanced, arrivals are routed at their arrival time, and every request's result is
the same `RequestResult`, tagged with its replica. This module builds the replicas, runs them
and adds up their counters into the keys a single deployment's summary has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from clients.conversation import Conversation
from server.engine.build import build_core
from server.engine.core import EngineCore
from server.engine.options import EngineOptions
from sim.admission import Admission
from sim.pools import FleetDispatch
from sim.reports import FleetStream, offload_report
from sim.virtual import run_cluster
from sim.virtual_types import Records, VirtualRun


@dataclass(frozen=True)
class Replica:
    """One copy of a deployment: its name in reports (`deployment/i` when there are
    several), the options it was built from and its engine core."""

    name: str
    options: EngineOptions
    core: EngineCore


@dataclass(frozen=True)
class ClusterRun:
    replicas: list[Replica]
    run: VirtualRun
    router: str
    dispatch: FleetDispatch | None = None  # pools, admission and KV links (issue 16)


def build_replicas(deployments: Sequence[EngineOptions]) -> list[Replica]:
    """`replicas` copies of each deployment, each with one core per data-parallel rank it runs
    (`local_ranks`, named `.../dp<rank>`; a MoE model's ranks share its experts, as in
    `serve`). Core j > 0 of a deployment draws with seed + j (output lengths, step jitter),
    so copies are not in lock-step; core 0 is the deployment as it is."""
    out = []
    for d in deployments:
        if d.replicas < 1:
            raise ValueError(f"{d.name}: replicas must be >= 1, got {d.replicas}")
        ranks = d.local_ranks
        for i in range(d.replicas):
            base = d.name if d.replicas == 1 else f"{d.name}/{i}"
            for k in range(ranks):
                j = i * ranks + k
                opts = d if j == 0 else dataclasses.replace(d, seed=d.seed + j)
                name = base if ranks == 1 else f"{base}/dp{d.data_parallel_start_rank + k}"
                out.append(Replica(name, opts, build_core(opts)))
    if not out:
        raise ValueError("a cluster needs at least one deployment")
    return out


def run_replicas(replicas: list[Replica], sessions: Iterable[Conversation], router: str,
                 seed: int = 0, concurrency: int | None = None,
                 admission: Admission | None = None,
                 records: Records | None = None) -> ClusterRun:
    """Run `sessions` through `replicas` behind the policy `router` (sim.routers.ROUTERS, or
    sim.pools.SLO_ROUTER); `seed` seeds a randomised policy (p2c). The fleet's pools (roles,
    SLO classes) and `admission` are applied by a `sim.pools.FleetDispatch`, which raises
    FleetError before the run when the pools cannot serve the sessions' classes."""
    cores = [r.core for r in replicas]
    dispatch = FleetDispatch(replicas, router, seed, admission)
    dispatch.check_classes({s.slo_class for s in sessions})
    run = run_cluster(cores, sessions, lambda prompt, outstanding, s: 0,
                      [r.options.max_waiting for r in replicas],
                      [r.options.max_grammar_bytes for r in replicas], concurrency,
                      dispatch=dispatch, records=records)
    return ClusterRun(replicas, run, router, dispatch)


def fleet_name(deployments: Sequence[EngineOptions]) -> str:
    """`a` for one copy of one deployment; `a×4 + b×1` for a pool."""
    if len(deployments) == 1 and deployments[0].replicas == 1:
        return deployments[0].name
    return " + ".join(f"{d.name}×{d.replicas}" for d in deployments)


def fleet_counters(cr: ClusterRun) -> dict[str, Any]:
    """The engine-side keys of a simulate summary, for the whole fleet: counts and energy
    add up; the prefix-cache hit rate is hits over lookups of all replicas; `peak_running`
    adds each replica's peak (they need not coincide: an upper bound on the fleet's)."""
    scheds = [r.core.scheduler for r in cr.replicas]
    stats = [r.core.stats for r in cr.replicas]
    queries = sum(s.stats.prefix_cache_queries for s in scheds)
    hits = sum(s.stats.prefix_cache_hits for s in scheds)
    return {
        "chips": sum(r.core.placement.chips for r in cr.replicas),
        "prefix_cache_hit_rate": hits / queries if queries else 0.0,
        "prefill_tokens": sum(s.stats.num_prefill_tokens for s in scheds),
        "preemptions": sum(s.stats.num_preemptions for s in scheds),
        "peak_running": sum(s.stats.peak_num_running for s in scheds),
        "max_num_seqs": sum(s.config.max_num_seqs for s in scheds),
        "steps": sum(s.steps for s in stats),
        "kv_usage_mean": cr.run.kv_usage_mean,
        "kv_usage_peak": cr.run.kv_usage_peak,
        "compiles": sum(s.compiles for s in stats),
        "compile_stall_s": sum(s.stall_s for s in stats),
        "cold_start_s": max(r.core.startup_s for r in cr.replicas),  # they build at once
        "jump_forward": any(r.core.jump_forward for r in cr.replicas),
        "joules": sum(s.joules for s in stats),
        "dollars": sum(s.dollars for s in stats),
        **offload_report(scheds),
        "emulated_s": cr.run.duration_s,
    }


def replica_reports(cr: ClusterRun) -> list[dict[str, Any]]:
    """Per replica: its name, deployment, chip, the requests it served (and refused) and its
    own prefix-cache hit rate."""
    recs = cr.run.records
    counts = (recs if isinstance(recs, FleetStream)
              else FleetStream.of(recs, (), len(cr.replicas)))  # type: ignore[arg-type]
    return [{"name": r.name, "deployment": r.options.name, "chip": r.options.chip,
             "requests": counts.served[k], "errors": counts.refused[k],
             "prefix_cache_hit_rate": r.core.scheduler.stats.prefix_cache_hit_rate}
            for k, r in enumerate(cr.replicas)]
