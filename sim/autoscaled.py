"""An autoscaled (or over-time sampled) cluster run: the deployments' slots, their autoscaler
and the report additions (issue 16; docs/AUTOSCALING.md).

A deployment with a policy gets 2 × `max` slots (enough for `max` provisioned while up to
`max` others drain), of which `replicas` (clamped to [min, max]) are ready at t = 0 — the
fleet as it stands when the run begins — and the rest off. A deployment without a policy keeps
its `replicas` ready throughout. The slots are ordinary replicas (sim/cluster.py); records
carry the slot index.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from clients.conversation import Conversation
from server.engine.build import build_core
from server.engine.options import EngineOptions
from sim.admission import Admission
from sim.autoscale import Autoscaler, Group, boot_seconds
from sim.autoscale_pd import ScaledDispatch
from sim.autoscale_policy import AutoscalePolicy, parse_policy
from sim.cluster import ClusterRun, Replica, build_replicas
from sim.pools import SLO_ROUTER, unserved
from sim.timeline import timeline
from sim.virtual import run_cluster


@dataclass(frozen=True)
class ScaledRun:
    cluster: ClusterRun
    control: Autoscaler
    groups: list[Group]


def policies(deployments: Sequence[EngineOptions], flag: str | None,
             ) -> list[AutoscalePolicy | None]:
    """Each deployment's policy: `--autoscale` for all of them if given, else its own
    `autoscaling` (the fleet file's table), else none."""
    out = []
    for d in deployments:
        spec = flag or d.autoscaling
        try:
            out.append(parse_policy(spec) if spec else None)
        except ValueError as e:
            raise ValueError(f"{d.name}: {e}") from None
    return out


def run_scaled(deployments: Sequence[EngineOptions], pols: Sequence[AutoscalePolicy | None],
               sessions: Iterable[Conversation], router: str, seed: int = 0,
               sample_s: float | None = None, concurrency: int | None = None,
               admission: Admission | None = None) -> ScaledRun:
    """Build the slots, run `sessions` through them behind `router` with the autoscaler as
    the loop's control (and the router's `admission`, if any), and return the run with its
    controller (samples, events, billing, requests shed)."""
    replicas: list[Replica] = []
    groups: list[Group] = []
    initial = []
    for d, p in zip(deployments, pols, strict=True):
        n = 2 * p.max if p else d.replicas
        first = max(p.min, min(p.max, d.replicas)) if p else d.replicas
        built = build_replicas([dataclasses.replace(d, replicas=n)])
        for i in range(first, n):  # booted by the autoscaler: warm once the boot is over
            r = built[i]
            warm = dataclasses.replace(r.options, start="prebuilt")
            built[i] = Replica(r.name, warm, build_core(warm))
        slots = list(range(len(replicas), len(replicas) + n))
        replicas += built
        boot = boot_seconds(built[-1].core, p) if p else 0.0
        groups.append(Group(d.name, slots, p, boot, classes=tuple(d.slo_classes),
                            role=d.role))
        initial.append(first)
    cores = [r.core for r in replicas]
    control = Autoscaler(cores, groups, initial, router, seed, sample_s, admission)
    dispatch = None
    if any(g.role != "both" for g in groups):  # P/D pools, each scaled on its own
        dispatch = ScaledDispatch(replicas, router, control, seed, admission)
        dispatch.check_classes({s.slo_class for s in sessions})
    elif router == SLO_ROUTER:  # every class of the run has a deployment serving it
        for c in sorted({s.slo_class for s in sessions}):
            if not any(g.serves(c) for g in groups):
                raise unserved(c)
    run = run_cluster(cores, sessions, control.choose, [r.options.max_waiting for r in replicas],
                      [r.options.max_grammar_bytes for r in replicas], concurrency,
                      dispatch=dispatch, control=control)
    return ScaledRun(ClusterRun(replicas, run, router, dispatch), control, groups)


def report(sr: ScaledRun) -> dict[str, Any]:
    """The summary keys an autoscaled run adds: `timeline` (sim/timeline.py) and
    `autoscaling`, per deployment: its policy, the cold start a new replica pays, the scale
    events and the replica-seconds billed (booting, ready and draining)."""
    rows = timeline(sr.control.samples, sr.cluster.run.records)
    auto = {}
    for g in sr.groups:
        billed = sum(sr.control.billed_s[k] for k in g.slots)
        auto[g.name] = {
            "policy": dataclasses.asdict(g.policy) if g.policy else None,
            "boot_s": g.boot_s,
            "events": g.events,
            "replica_seconds": billed,
        }
    return {"timeline": rows, "autoscaling": auto}


def used(sr: ScaledRun) -> list[int]:
    """The slots that were ever provisioned (the per-replica report lists only these)."""
    return [k for k, s in enumerate(sr.control.billed_s)
            if s > 0 or sr.control.state[k] != "off"]
