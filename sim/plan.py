"""`doppelchip plan`: the cheapest fleet (dollars per hour) that meets an SLO at a rate.

The search (docs/PLAN.md):

1. the analytic model prunes the grid and gives each surviving config its price per replica
   and the least replica count worth simulating (sim.plan_space); the configs make the
   search's units (an aggregated config; a P/D pair of a prefill and a decode shape);
2. best first by fleet price: the cheapest untried (unit, replicas) candidates, a batch of
   `executor.jobs` at a time, are simulated in virtual time on the cluster simulator (the path
   of `doppelchip simulate --config FLEET.toml --router R`); a config that misses the SLO
   comes back with one replica more (in each of its pools in turn), unless more replicas
   stopped helping (the misses did not shrink) or it hit `max_replicas`;
3. once `runners_up` + 1 units have met the SLO, nothing dearer than the last of them is
   tried: every candidate cheaper has been simulated (the first count meeting the SLO is a
   unit's cheapest, assuming more replicas never hurt), so the winner is the cheapest and
   the runners-up are the next cheapest units.

The answer is a function of the grid, the workload and the SLO only: batches never change
which candidates at or under the final ceiling are simulated, so the pool, Ray and any `jobs`
give the same winner, runners-up and frontier.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from clients.workloads import WorkloadSpec
from server.engine.options import EngineOptions
from sim.plan_exec import Simulate, Task
from sim.plan_fleet import fleet_text, pd_names, simulate_argv
from sim.plan_slo import PlanSlo, check
from sim.plan_space import (
    POOLS,
    SearchSpace,
    Sized,
    WorkloadShape,
    configs,
    output_mean,
)
from sim.plan_trace import observed_shape
from sim.plan_units import Unit, units

RUNNERS_UP = 3
# the engine's mean output length when EOS is sampled (the plan's candidates keep its default)
EOS_MEAN = next(f.default for f in fields(EngineOptions) if f.name == "output_len_mean")
HELPED = 0.98  # one more replica must shrink some latency (or the goodput shortfall) by 2%


@dataclass
class PlanInputs:
    """What a plan is asked: the grid, the workload (its spec and its simulate flags), the
    SLO, the router of every candidate."""

    space: SearchSpace
    workload: WorkloadSpec
    workload_argv: list[str]
    slo: PlanSlo
    router: str = "least-requests"
    eos_mean: float = EOS_MEAN
    runners_up: int = RUNNERS_UP
    work: WorkloadShape | None = None  # the workload's shape, once `shape` has read it

    def workload_shape(self) -> WorkloadShape:
        if self.work is None:
            self.work = shape(self.workload, self.eos_mean)
        return self.work


def shape(w: WorkloadSpec, eos_mean: float) -> WorkloadShape:
    """The workload as the analytic model sees it. Lengths with a spread use their largest
    value for the context and the run's own prompts for the quantiles of the latency floors;
    a length file's lengths are the run's own; a mix's context is unknown (None: not
    checked). A trace and a rate shape are read off their conversations (sim.plan_trace)."""
    if w.kind == "trace" or w.rate_shape:
        return observed_shape(w, eos_mean)
    spread = 1 + (w.length_spread * (3 if w.length_dist == "normal" else 1)
                  if w.length_dist in ("uniform", "normal") else 0)
    known = w.kind in ("random", "shared-prefix", "multi-turn", "structured") and \
        w.length_dist != "histogram"
    isl, osl = math.ceil(w.isl * spread), math.ceil(w.osl * spread)
    turns = w.turns if w.kind == "multi-turn" else 1
    system = w.system_prompt_len if w.kind == "shared-prefix" else 0
    context = system + (isl + osl) * turns if known else None
    base = WorkloadShape(rate=w.rate, prompt=w.isl, output_mean=output_mean(
        w.osl, w.ignore_eos, eos_mean), output_max=w.osl, context=context)
    if w.length_dist == "fixed":
        return base
    seen = observed_shape(w, eos_mean, rate=w.rate, shared=system)  # the run's own lengths
    if w.length_dist == "histogram":  # --isl and --osl play no part: the file's lengths do
        return dataclasses.replace(seen, context=seen.context if context is None else context)
    return dataclasses.replace(base, prompt_quantiles=seen.prompt_quantiles)


def describe(w: WorkloadSpec, work: WorkloadShape) -> str:
    """The traffic planned for, as the fleet file's header and the report say it."""
    if w.kind == "trace":
        return (f"{work.rate:.4g} req/s (the trace's mean rate: {w.trace_path}; prompts "
                f"{work.prompt} tokens on average, outputs {work.output_mean:.4g})")
    rate = f"{work.rate:.4g} req/s (the mean of {w.rate_shape})" if w.rate_shape else \
        f"{w.rate:g} req/s"
    return f"{rate} ({w.kind}, isl {w.isl}, osl {w.osl})"


def badness(summary: dict[str, Any], slo: PlanSlo) -> float:
    """The worst ratio of a term's value to its bound (> 1: missed), goodput inverted."""
    worst = 0.0
    if slo.bounds:
        worst = max(worst, slo.goodput / max(summary["goodput"]["fraction"], 1e-9))
    for (metric, stat), bound in slo.stats.items():
        worst = max(worst, summary[f"{metric}_s"][stat] / bound)
    return worst


def progress_vector(summary: dict[str, Any], slo: PlanSlo) -> list[float]:
    """What more replicas should shrink: the goodput shortfall and the p50/p90/p99 of every
    metric the SLO bounds (a fleet whose latencies stop falling is not helped by replicas)."""
    out = [1 - summary["goodput"]["fraction"]] if slo.bounds else []
    metrics = {*slo.bounds, *(m for m, _ in slo.stats)}
    return out + [summary[f"{m}_s"][p] for m in sorted(metrics) for p in ("p50", "p90", "p99")]


def helped(now: list[float], before: list[float] | None) -> bool:
    return before is None or any(a < b * HELPED for a, b in zip(now, before, strict=True))


SHAPE_KEYS = ("chip", "engine", "quant", "model", "tp", "pp", "ep", "dp", "count",
              "max_num_seqs", "max_model_len", "kv_offloading_size", "hf_overrides",
              "pooler_config")


def record(unit: Unit, counts: tuple[int, ...], out: dict[str, Any], inputs: PlanInputs,
           header: str, argv: tuple[str, ...]) -> dict[str, Any]:
    """One simulated candidate: what it is, what it costs, how it did, where it ran. The
    shape keys (`chip`, `tp`, ...) are the config's; a P/D candidate also has `pools` (its
    replica counts) and `pool_shapes` (each pool's deployment name in the fleet file and
    shape), and for two shapes the top-level keys they differ in join them with "+"."""
    configs = unit.configs
    shape: dict[str, Any] = {}
    for k in SHAPE_KEYS:
        values = list(dict.fromkeys(getattr(c, k) for c in configs))
        shape[k] = values[0] if len(values) == 1 else "+".join(map(str, values))
    rec: dict[str, Any] = {
        "deployment": unit.name, **shape, "mode": unit.mode, "replicas": sum(counts),
        "chips": unit.chips(counts),
        "usd_per_hour": unit.usd_per_hour(counts), "min_replicas": sum(unit.start),
        "fleet": fleet_text(configs, counts, header), "argv": list(argv),
        "pid": out["pid"], **{k: out[k] for k in ("ray_worker_id", "ray_node_id") if k in out},
    }
    if unit.mode in POOLS:
        rec["pools"] = dict(zip(POOLS[unit.mode], counts, strict=True))
        names = pd_names(configs)
        rec["pool_shapes"] = {role: {"deployment": names[role],
                                     **{k: getattr(c, k) for k in SHAPE_KEYS}}
                              for role, c in zip(POOLS[unit.mode], configs, strict=True)}
    if "error" in out:
        return {**rec, "meets_slo": False, "misses": [out["error"]], "badness": math.inf,
                "progress": None}
    s = out["summary"]
    misses = check(s, inputs.slo)
    metric, stat = inputs.slo.latency_key()
    return {**rec, "meets_slo": not misses, "misses": misses, "badness": badness(s, inputs.slo),
            "progress": progress_vector(s, inputs.slo),
            "usd_per_mtok": s["usd_per_mtok"], "requests_per_s": s["requests_per_s"],
            **({"usd_per_m_input_tok": s["pooling"]["usd_per_m_input_tok"]}
               if "pooling" in s else {}),  # embedding models (docs/EMBEDDINGS.md)
            "output_tokens_per_s": s["output_tokens_per_s"],
            "goodput_fraction": s.get("goodput", {}).get("fraction"),
            "latency": {f"{m}_{p}": s[f"{m}_s"][p] for m in ("ttft", "tpot", "e2e")
                        for p in ("p50", "p99")},
            "frontier_latency_s": s[f"{metric}_s"][stat]}


def successors(counts: tuple[int, ...]) -> list[tuple[int, ...]]:
    """One replica more, in each pool in turn."""
    return [tuple(n + (k == j) for j, n in enumerate(counts)) for k in range(len(counts))]


def search(inputs: PlanInputs, executor: Any, simulate: Simulate,
           progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The plan: {"winner", "runners_up", "frontier", "pruned", "searched", ...}."""
    started = time.monotonic()
    work = inputs.workload_shape()
    kept, pruned = configs(inputs.space, work, inputs.slo)
    found = units(kept)
    header = f"doppelchip plan: {inputs.slo.text()} at {describe(inputs.workload, work)}"

    argv = simulate_argv(inputs.router, inputs.workload_argv, inputs.slo.simulate_flag())
    # (price, config index, replica counts, the progress of the candidate it came from)
    heap: list[tuple[float, int, tuple[int, ...], list[float] | None]] = [
        (u.usd_per_hour(u.start), i, u.start, None) for i, u in enumerate(found)]
    heapq.heapify(heap)
    met: list[float] = []  # the prices of the units that met the SLO, cheapest first
    passed: set[int] = set()  # units that met it: their cheapest fleet is found
    tried: set[tuple[int, tuple[int, ...]]] = set()
    done: list[dict[str, Any]] = []
    batches = 0
    while heap:
        ceiling = met[inputs.runners_up] if len(met) > inputs.runners_up else math.inf
        batch = []
        while heap and heap[0][0] <= ceiling and len(batch) < executor.jobs:
            entry = heapq.heappop(heap)
            if entry[1] not in passed and entry[1:3] not in tried:  # P/D: reached twice
                tried.add(entry[1:3])
                batch.append(entry)
        if not batch:
            break
        batches += 1
        tasks = [Task(fleet_text(found[i].configs, n, header), argv) for _, i, n, _ in batch]
        for (cost, i, counts, parent), out in zip(batch, executor.map(simulate, tasks),
                                                  strict=True):
            rec = record(found[i], counts, out, inputs, header, argv)
            done.append(rec)
            if rec["meets_slo"]:
                if i not in passed:
                    passed.add(i)
                    met = sorted([*met, cost])
                continue
            if rec["progress"] is None:  # it did not run: more replicas will not either
                continue
            if not helped(rec["progress"], parent):
                continue
            for nxt in successors(counts):
                if sum(nxt) <= inputs.space.max_replicas:
                    heapq.heappush(heap, (found[i].usd_per_hour(nxt), i, nxt,
                                          rec["progress"]))
        if progress:
            progress(f"batch {batches}: {len(done)} candidates simulated, "
                     + (f"cheapest meeting the SLO ${met[0]:.4g}/h" if met else
                        "none meets the SLO yet"))
    ceiling = met[inputs.runners_up] if len(met) > inputs.runners_up else math.inf
    return summarize_search(inputs, kept, pruned, done, ceiling, batches,
                            time.monotonic() - started)


def key(rec: dict[str, Any]) -> tuple:
    """Cheapest first; at one price the faster (so the winner is on the frontier), then by
    name for a stable order."""
    return (rec["usd_per_hour"], rec.get("frontier_latency_s", math.inf), rec["deployment"],
            rec["replicas"])


def pareto(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cost vs latency: the candidates no other is both cheaper (or as cheap) and faster
    than, cheapest first (each slower-but-cheaper point buys its speed with dollars)."""
    out: list[dict[str, Any]] = []
    for rec in sorted(recs, key=lambda r: (r["usd_per_hour"], r["frontier_latency_s"],
                                           r["deployment"])):
        if not out or rec["frontier_latency_s"] < out[-1]["frontier_latency_s"]:
            out.append(rec)
    return out


def summarize_search(inputs: PlanInputs, kept: list[Sized], pruned: list, done: list,
                     ceiling: float, batches: int, wall_s: float) -> dict[str, Any]:
    within = sorted((r for r in done if r["meets_slo"] and r["usd_per_hour"] <= ceiling),
                    key=key)
    winner = within[0] if within else None
    runners = [] if winner is None else \
        [r for r in within[1:] if r["deployment"] != winner["deployment"]][:inputs.runners_up]
    metric, stat = inputs.slo.latency_key()
    shown = [r for r in done if r["usd_per_hour"] <= ceiling]
    return {
        "winner": winner, "runners_up": runners, "frontier": pareto(within),
        "frontier_metric": f"{metric}_{stat}",
        "frontier_bound_s": inputs.slo.stats.get((metric, stat)) or inputs.slo.bounds.get(metric),
        "candidates": sorted(shown, key=key),
        "closest": [] if winner else sorted(done, key=lambda r: (r["badness"], key(r)))[:5],
        "pruned": [{"deployment": c.name, "why": why} for c, why in pruned],
        "searched": {"configs": len(kept) + len(pruned), "pruned": len(pruned),
                     "simulated": len(done), "batches": batches, "wall_s": wall_s},
        "slo": inputs.slo.text(), "rate": inputs.workload_shape().rate, "router": inputs.router,
        "configs": [{"deployment": s.config.name, "usd_per_replica_hour": s.usd_per_hour,
                     "min_replicas": s.min_replicas,
                     "replica_output_tokens_per_s": s.replica_output_tokens_per_s,
                     "replica_prefill_tokens_per_s": s.replica_prefill_tokens_per_s}
                    for s in kept],
    }
