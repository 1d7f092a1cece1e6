"""`doppelchip simulate`: a workload through one deployment in virtual time, and its report.

The front door joins the layers: the workload comes from `clients.workloads`, the engine
core from `server.engine.build`, `run_virtual` from `sim.virtual`, and the records
go back to `clients.report` — the same summary the load generator prints for a gRPC server.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from doppelchip.sim_flags import add_deployment_args, add_traffic_args, add_workload_args

# `simulate`'s arrivals when --rate is not given: a Poisson stream at this rate (issue 15; all
# at once hides what static batching and contiguous KV cost a newcomer's first run)
SIMULATE_DEFAULT_RATE = 10.0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate", help="run a workload through one deployment in virtual time",
        description="Simulate a workload in virtual time (no sleeping: hours of traffic in "
        "seconds) with the server's own scheduler, KV cache and device model, and report "
        "throughput, latency percentiles, cache hits, preemptions, compile stalls, energy "
        f"and cost. Requests arrive as a Poisson stream at --rate (default "
        f"{SIMULATE_DEFAULT_RATE:g} per second); --rate inf sends them all at once.",
    )
    add_deployment_args(p)
    add_workload_args(p, default_rate=SIMULATE_DEFAULT_RATE)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    # --- virtual-time clusters (issue 16): sim/fleet_simulation.py, docs/LOAD.md ---
    p.add_argument("--router", choices=ROUTERS,
                   help="simulate every deployment of --config (each `replicas` copies) as "
                   "one pool behind this router (default with replicas > 1: round-robin)")
    # --- end virtual-time clusters ---
    add_fleet_args(p)
    add_autoscale_args(p)  # --- autoscale (issue 16) ---
    # --- capacity planning (issue 16): what `doppelchip plan` checks (docs/PLAN.md) ---
    g = p.add_argument_group("SLO (as load --slo)")
    g.add_argument("--slo", metavar="ttft=S,tpot=S,e2e=S",
                   help="per-request latency bounds in seconds; the summary adds the share "
                   "of requests meeting every one (goodput)")
    # --- end capacity planning ---
    # --- speed (issue 16): server/engine/macro.py ---
    g = p.add_argument_group("virtual-time speed")
    g.add_argument("--no-macro-steps", dest="macro_steps", action="store_false",
                   help="advance every engine step on its own instead of windows of decode "
                   "steps at once (the same results, slower: a check on macro-stepping)")
    # --- end speed ---
    p.set_defaults(func=cmd_simulate)


# sim.routers.ROUTERS' names and sim.pools.SLO_ROUTER, listed here so that the command line
# imports no layer
ROUTERS = ("round-robin", "least-requests", "least-kv", "prefix-aware", "p2c", "slo-class")


def add_fleet_args(p: argparse.ArgumentParser) -> None:
    """--- fleet (issue 16): SLO classes and admission at the router (docs/PLANNING.md) ---"""
    g = p.add_argument_group("fleet: SLO classes, admission, P/D pools (docs/PLANNING.md)")
    g.add_argument("--slo-class-mix", metavar="CLASS=W,...",
                   help="tag the workload's requests with SLO classes drawn by weight (seeded "
                   "by --seed), e.g. interactive=0.3,batch=0.7; a trace's own slo_class is "
                   "kept. --router slo-class sends each class to the pools listing it "
                   "(fleet-file slo_classes)")
    g.add_argument("--admission", metavar="RULE,...",
                   help="admission at the router, as the Gateway API inference extension's "
                   "saturation detectors: max-outstanding=N (per replica) and/or "
                   "queue-depth=Q,kv-util=U; refused requests end RESOURCE_EXHAUSTED; "
                   "critical=CLASS+CLASS: those SLO classes are never shed (GIE's priority "
                   ">= 0), queued on a replica instead")


# --- autoscale (issue 16): sim/autoscale.py, clients/arrivals.py, docs/AUTOSCALING.md ---
def add_autoscale_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("autoscaling and traffic over time (docs/AUTOSCALING.md)")
    g.add_argument("--autoscale", metavar="SPEC",
                   help="HPA-style autoscaler for every deployment of the pool, e.g. "
                   "metric=waiting,target=4,min=1,max=8 (metric: waiting | kv | running; "
                   "also tolerance, sync_period_s, scale_down_window_s, scale_up_window_s, "
                   "boot_s, provision_s); a deployment's [autoscaling] table does the same")
    g.add_argument("--timeline", type=float, metavar="SECONDS",
                   help="report the fleet over time every SECONDS (default with an "
                   "autoscaler: its sync period)")
    add_traffic_args(g)
    g.add_argument("--html", metavar="FILE",
                   help="write an HTML report: the summary, replicas and pools as tables, "
                   "and (with --timeline or an autoscaler) replicas, queue, latency and "
                   "dollars over time")
# --- end autoscale ---



def cmd_simulate(args: argparse.Namespace) -> int:
    from doppelchip.outpaths import unwritable
    from sim.fleet_simulation import simulate_fleet, wants_cluster
    from sim.sim_args import simulate
    from sim.simulation import SimulationError

    if not getattr(args, "macro_steps", True):  # --- speed (issue 16) ---
        from sim.virtual import MACRO_STEPS
        MACRO_STEPS["default"] = False
    try:  # --- virtual-time clusters (issue 16) ---
        problem = unwritable([("--html", getattr(args, "html", None))])
        if problem:  # before the run, not after it
            raise SimulationError(problem)
        summary = simulate_fleet(args) if wants_cluster(args) else simulate(args)
    except SimulationError as e:
        print(json.dumps({"error": str(e)}) if args.json else f"error: {e}", file=sys.stderr)
        return 2
    if getattr(args, "html", None):  # --- autoscale (issue 16): the report over time ---
        from clients.timeline_report import render_timeline
        from doppelchip.simulate_format import fleet_notes, format_summary

        with open(args.html, "w") as f:  # the terminal's summary lines, as a table
            f.write(render_timeline(summary, format_summary(summary).splitlines()
                                    + fleet_notes(summary)))
    if args.json:
        print(json.dumps(summary))
    else:
        from doppelchip.simulate_format import format_fleet, format_summary, replica_lines

        print(format_summary(summary))
        for line in replica_lines(summary):  # --- virtual-time clusters (issue 16) ---
            print(line)
        fleet_tables = format_fleet(summary)  # --- fleet (issue 16) ---
        if fleet_tables:
            print(fleet_tables)
        if summary.get("timeline"):  # --- autoscale (issue 16) ---
            from clients.timeline_text import format_scaling, format_timeline

            scaling = format_scaling(summary)
            if scaling:
                print(scaling)
            print(format_timeline(summary["timeline"]))
    return 0
