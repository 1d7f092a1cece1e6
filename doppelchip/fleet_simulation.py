"""`doppelchip simulate --router`: every deployment of a fleet file (each `replicas` copies)
as one pool behind a router, in virtual time (sim/cluster.py), reported with the same summary
as one deployment plus a `replicas` list."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from clients.report import summarize
from clients.workloads import build_workload
from doppelchip.simulation import (
    FAULT_KEYS,
    SimulationError,
    options_from_args,
    to_result,
    to_sessions,
    with_goodput,
    workload_from_args,
)
from server.config import ConfigError, load_fleet
from server.engine.build import EngineOptions
from server.engine.tokenizer import get_tokenizer
from sim.cluster import (
    build_replicas,
    fleet_counters,
    fleet_name,
    replica_reports,
    run_replicas,
)


def wants_cluster(args: argparse.Namespace) -> bool:
    """A router was asked for, or the deployment simulated has several replicas."""
    if getattr(args, "router", None):
        return True
    if args.chip or args.model or args.engine or args.quant:
        return False
    return options_from_args(args).replicas > 1


def fleet_options(args: argparse.Namespace) -> list[EngineOptions]:
    """The deployments to pool: `--deployment`'s alone, or every one of the file (the built-in
    fleet without --config), each with the command line's overrides."""
    if args.chip or args.model or args.engine or args.quant or args.deployment:
        return [options_from_args(args)]
    try:
        fleet = load_fleet(args.config)
    except ConfigError as e:
        raise SimulationError(str(e)) from e
    return [options_from_args(argparse.Namespace(**{**vars(args), "deployment": d.name}))
            for d in fleet.deployments]


def simulate_fleet(args: argparse.Namespace) -> dict[str, Any]:
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
        conversations = build_workload(workload, encode=get_tokenizer().encode)
    except (ValueError, OSError) as e:
        raise SimulationError(str(e)) from e
    cr = run_replicas(replicas, to_sessions(conversations), args.router or "round-robin",
                      seed=args.seed)
    results = [to_result(r) for r in cr.run.records]
    counters = fleet_counters(cr)
    joules, dollars = counters.pop("joules"), counters.pop("dollars")
    emulated_s = counters.pop("emulated_s")  # last, as in simulation.simulate_conversations
    out_tokens = sum(r.output_tokens for r in results if r.ok)
    per_mtok = 1e6 / out_tokens if out_tokens else 0.0
    summary = summarize(results, deployment=fleet_name(deployments), target="sim", **counters,
                        joules_per_mtok=joules * per_mtok, usd_per_mtok=dollars * per_mtok,
                        emulated_s=emulated_s)
    summary["router"] = cr.router
    summary["replicas"] = replica_reports(cr)
    return with_goodput(summary, results, getattr(args, "slo", None))  # issue 16: plan
