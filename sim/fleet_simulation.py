"""`doppelchip simulate --router`: every deployment of a fleet file (each `replicas` copies)
as one pool behind a router, in virtual time (sim/cluster.py), reported with the same summary
as one deployment plus a `replicas` list; with pools (roles, SLO classes; issue 16) also
`pools` and `classes` (sim/reports.py), and `admission_refused` with `--admission`."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

from clients.workloads import stream_workload
from server.config import ConfigError, load_fleet
from server.engine.options import EngineOptions
from server.engine.tokenizer import get_tokenizer
from sim.sim_args import options_from_args, slo_from_args, workload_from_args
from sim.simulation import FAULT_KEYS, SimulationError

if TYPE_CHECKING:  # the cluster modules load with a cluster run, not with every simulate
    from sim.autoscale_policy import AutoscalePolicy
    from sim.cluster import ClusterRun
    from sim.reports import FleetStream


def wants_cluster(args: argparse.Namespace) -> bool:
    """A router was asked for (or admission at one, or SLO classes to report), or the
    deployment simulated has several replicas."""
    if any(getattr(args, k, None) for k in ("router", "admission", "slo_class_mix")):
        return True
    if getattr(args, "autoscale", None) or getattr(args, "timeline", None) is not None:
        return True
    if args.chip or args.model or args.engine or args.quant:
        return False
    opts = options_from_args(args)
    return (opts.replicas > 1 or opts.local_ranks > 1  # data-parallel ranks: a core each
            or opts.autoscaling is not None)  # (autoscale: issue 16)


def fleet_options(args: argparse.Namespace) -> list[EngineOptions]:
    """The deployments to pool: `--deployment`'s alone, or every one of `--config`'s file, each
    with the command line's overrides. Without --config, the built-in fleet's default
    deployment alone, as `simulate` without a router: its other deployments serve other
    models (a Llama 2 70B on Groq), which no workload of one model is meant to reach."""
    if (args.chip or args.model or args.engine or args.quant or args.deployment
            or not getattr(args, "config", None)):
        return [options_from_args(args)]
    try:
        fleet = load_fleet(args.config)
    except ConfigError as e:
        raise SimulationError(str(e)) from e
    return [options_from_args(argparse.Namespace(**{**vars(args), "deployment": d.name}))
            for d in fleet.deployments]


def simulate_fleet(args: argparse.Namespace) -> dict[str, Any]:
    from devices.placement import served_model
    from sim.admission import parse_admission
    from sim.autoscaled import report, run_scaled, used
    from sim.cluster import (
        build_replicas,
        fleet_counters,
        fleet_name,
        replica_reports,
        run_replicas,
    )
    from sim.pools import FleetError, pools_of
    from sim.reports import FleetStream, pooling_report

    deployments = fleet_options(args)
    for d in deployments:
        injected = [k for k in FAULT_KEYS if k != "failure_injection_seed" and getattr(d, k)]
        if injected:  # as simulation.simulate_conversations: the served path only
            raise SimulationError(f"{d.name}: {', '.join(injected)}: failure injection runs "
                                  "in `doppelchip serve`, not in virtual time")
    try:
        replicas = build_replicas(deployments)
    except Exception as e:  # DeviceError, ValueError: the message says why
        raise SimulationError(str(e)) from e
    workload = dataclasses.replace(workload_from_args(args),
                                   vocab_size=get_tokenizer().vocab_size)
    try:
        conversations = stream_workload(workload, encode=get_tokenizer().encode)
    except (ValueError, OSError) as e:
        raise SimulationError(str(e)) from e
    scaled = _scaled(args, deployments)  # --- autoscale (issue 16) ---
    ranked = any(d.local_ranks > 1 for d in deployments)
    if scaled is not None and ranked:
        raise SimulationError("autoscaling a deployment of several data-parallel ranks is not "
                              "simulated (scale its replicas, each one rank)")
    # vLLM's front end balances over its data-parallel ranks (sim.routers.VllmDp)
    router = args.router or ("vllm-dp" if ranked else "round-robin")
    slo = slo_from_args(args)  # issue 16: plan
    try:  # --- fleet (issue 16): pools, SLO classes, admission ---
        admission = parse_admission(getattr(args, "admission", None))
        if scaled is not None:  # its timeline reads every record: kept in a list
            pols, sample_s = scaled
            sr = run_scaled(deployments, pols, conversations, router,
                            seed=args.seed, sample_s=sample_s, admission=admission)
            cr = sr.cluster
            stream = FleetStream(pools_of(cr.replicas), len(cr.replicas), slo)
            for r in cr.run.records:
                stream.append(r)
        else:  # summarised as the requests end (memory flat with the request count)
            stream = FleetStream(pools_of(replicas), len(replicas), slo)
            cr = run_replicas(replicas, conversations, router,
                              seed=args.seed, admission=admission, records=stream)
    except (FleetError, ValueError) as e:
        raise SimulationError(str(e)) from e
    counters = fleet_counters(cr)
    joules, dollars = counters.pop("joules"), counters.pop("dollars")
    emulated_s = counters.pop("emulated_s")  # last, as in simulation.simulate_conversations
    out_tokens = stream.fleet.output
    per_mtok = 1e6 / out_tokens if out_tokens else 0.0
    summary = stream.fleet.summary(deployment=fleet_name(deployments), target="sim",
                                   **counters, joules_per_mtok=joules * per_mtok,
                                   usd_per_mtok=dollars * per_mtok, emulated_s=emulated_s)
    summary.update(pooling_report(all(served_model(d.spec()).is_pooling for d in deployments),
                                  joules, dollars, stream.fleet.prompt))
    summary["router"] = cr.router
    summary["replicas"] = replica_reports(cr)
    if cr.dispatch is not None:  # --- fleet (issue 16) ---
        add_fleet_parts(summary, cr, stream, admission is not None)
    if scaled is not None:  # --- autoscale (issue 16) ---
        keep = used(sr)  # slots never provisioned are not part of the fleet
        summary["replicas"] = [summary["replicas"][k] for k in keep]
        summary["chips"] = sum(cr.replicas[k].core.placement.chips for k in keep)
        summary["max_num_seqs"] = sum(cr.replicas[k].core.scheduler.config.max_num_seqs
                                      for k in keep)
        summary.update(report(sr))
        for row in summary.get("pools", ()):  # P/D: a pool's slots ever provisioned, and
            g = next(g for g in sr.groups if g.name == row["name"])  # its billed cost per hour
            row["replicas"] = sum(1 for k in g.slots if k in keep)
            billed = sum(sr.control.billed_s[k] * cr.replicas[k].core.dollars_per_s
                         for k in g.slots)
            row["usd_per_hour"] = billed * 3600 / emulated_s if emulated_s else 0.0
        if admission is not None:  # (a P/D fleet's dispatch counts its own)
            summary["admission_refused"] = sr.control.refused + (cr.dispatch.refused
                                                                 if cr.dispatch else 0)
        if classes := stream.class_reports():  # as a fixed fleet's (its pools: `autoscaling`)
            summary["classes"] = classes
    if slo is not None:  # as `simulate --slo` of one deployment
        summary["slo"] = slo
        summary["goodput"] = stream.fleet.goodput()
    return summary


def add_fleet_parts(summary: dict[str, Any], cr: ClusterRun, stream: FleetStream,
                    admission: bool) -> None:
    """`pools` (when the fleet has several, roles or classes), `classes` (when requests have
    classes), `admission_refused` (with --admission); a P/D fleet's `kv_transfers` and each
    replica's `prefills`."""
    d = cr.dispatch
    assert d is not None
    plain = len(d.pools) == 1 and d.pools[0].role == "both" and not d.pools[0].classes
    if not plain:
        summary["pools"] = stream.pool_reports(d.cores)
    classes = stream.class_reports()
    if classes:
        summary["classes"] = classes
    if admission:
        summary["admission_refused"] = d.refused
    if d.pd:
        for row, n in zip(summary["replicas"], stream.prefills, strict=True):
            row["prefills"] = n
        summary["kv_transfers"] = {"count": d.links.transfers, "bytes": d.links.bytes,
                                   "seconds": d.links.seconds}


def _scaled(args: argparse.Namespace, deployments: list[EngineOptions],
            ) -> tuple[list[AutoscalePolicy | None], float | None] | None:
    """(each deployment's autoscaling policy, the timeline interval) when the run autoscales
    or asks for a timeline; None for a fixed pool (sim/cluster.py as before)."""
    from sim.autoscaled import policies

    try:
        pols = policies(deployments, getattr(args, "autoscale", None))
    except ValueError as e:
        raise SimulationError(str(e)) from e
    sample_s = getattr(args, "timeline", None)
    if sample_s is not None and not sample_s > 0:
        raise SimulationError("--timeline must be > 0 seconds")
    if sample_s is None and not any(pols):
        return None
    return pols, sample_s
