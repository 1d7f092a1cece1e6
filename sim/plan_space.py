"""The configurations `doppelchip plan` searches, and what the analytic model says of each
before anything is simulated.

A `Config` is one deployment shape (chip, engine, quantisation, TP/PP/EP, data-parallel
ranks, `max_num_seqs`, serving mode); a candidate is a config times a replica count.
`configs()` expands a `SearchSpace` and prunes with the catalogue and the device model, never
with a simulation:

- the engine runs on the chip's class and loads the quantisation's family (catalogue);
- the deployment places (`devices.place`: weights + KV fit; TP divides the heads, ...) and its
  context holds the workload's longest request;
- a CPU KV tier (`kv_offloading_size`, vLLM's `--kv-offloading-size`) needs the chip's host
  link and the engine's prefix cache (the deployment's build says why not); it costs nothing
  here: the catalogue's prices are of the instance, its host memory included. ASSUMPTION: the
  host has the GiB asked for. The bounds ignore it, as they ignore the prefix cache;
- data-parallel ranks (`dp` > 1, vLLM's `--data-parallel-size`) are searched where they are a
  shape of their own: a MoE model on an engine whose ranks share its experts (the catalogue's
  `dp_shares_experts`: one expert group over every rank's chips). Elsewhere ranks are copies,
  which the replica count already searches. On such an engine, experts sharded over more chips
  than TP's (`ep` > `tp`) are that engine's ranks, not attention replicas inside one core, so
  that shape is searched as `dp`, not `ep`;
- its unloaded latency (`devices.estimate` at batch 1) is within every SLO bound: no replica
  count lowers a latency a lone request already exceeds. With lengths that vary, the lone
  request is the shortest one the SLO constrains: a goodput fraction f is met only if the
  f·N shortest requests meet it, so the floor is taken at the prompt of quantile f (or of the
  statistic's percentile), never above the mean prompt (`prompt_floor`).

Each survivor carries its price per replica-hour and `min_replicas`, the least replica count
worth simulating: the offered output tokens per second over an upper bound on one replica's
output rate — `estimate`'s decode rate at its largest batch (a replica of `dp` ranks: `dp`
times one rank's, every rank at that batch) (`max_num_seqs`, or what the KV
pool holds; with a TPOT bound, the largest batch whose decode step is within it), prefill
ignored. A step never yields more than its batch's tokens and costs at least the decode step
of that batch, and batch / step time grows with the batch, so no replica outputs faster
(nor, while most of its requests meet the TPOT bound, faster than at that batch); fewer
replicas cannot sustain the rate. Likewise for prefill: every prompt token that is not a
prefix-cache hit is prefilled, and no step prefills faster than `estimate`'s prefill rate
(the engine's token budget per step, compute-bound), so the offered prompt tokens (the new
user tokens, `--isl`; a shared system prompt may hit the cache) over that rate bound the count
too; the larger of the two bounds is `min_replicas`.

`sim.plan_units` pairs the survivors into the search's units (a P/D pair of two shapes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from devices import DeploymentSpec, DeviceError, catalog, estimate, place
from devices.place_sram import chips_needed
from devices.placement import served_model
from server.engine.kv_offload import host_tier
from server.engine.kv_offload_config import OffloadConfig
from server.engine.options import EngineOptions
from server.engine.scheduler_defaults import engine_defaults, scheduler_config
from sim.plan_slo import PlanSlo

# Serving modes: how sim.plan_fleet writes a candidate's fleet file. "pd" (disaggregated
# prefill/decode pools, the fleet file's `role` key) is offered once the fleet file has that
# key (docs/PLAN.md); POOLS names the replica counts of a mode with several pools.
PD_AVAILABLE = "role" in {f.name for f in dataclasses.fields(EngineOptions)}
MODES = ("aggregated", "pd") if PD_AVAILABLE else ("aggregated",)
POOLS = {"pd": ("prefill", "decode")}
LB_SLACK = 0.9  # the lower bound assumes 90% of the expected output tokens (sampling noise)


@dataclass(frozen=True, order=True)
class Config:
    """One deployment shape. `count` is set for SRAM chips (sized for the workload) and None
    elsewhere (tp × pp × ep chips, times `dp` ranks); `max_num_seqs` None is the engine's
    default (per rank)."""

    chip: str
    engine: str
    quant: str
    model: str
    tp: int = 1
    pp: int = 1
    ep: int | None = None
    count: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    mode: str = "aggregated"
    dp: int = 1  # data-parallel ranks (engine cores) of one replica
    kv_offloading_size: float | None = None  # GiB of vLLM's CPU KV tier (docs/KV_OFFLOAD.md)
    hf_overrides: str | None = None  # vLLM's, as given (a reranker's: docs/EMBEDDINGS.md)
    pooler_config: str | None = None  # vLLM's --pooler-config, as given (a pooling model's)

    @property
    def name(self) -> str:
        """A deployment name unique within a search: every dimension that varies."""
        par = f"tp{self.tp}" + (f"pp{self.pp}" if self.pp > 1 else "") + \
            (f"ep{self.ep}" if self.ep else "") + (f"dp{self.dp}" if self.dp > 1 else "") + \
            (f"x{self.count}" if self.count else "")
        seqs = f"-seqs{self.max_num_seqs}" if self.max_num_seqs else ""
        cpu = f"-cpu{self.kv_offloading_size:g}" if self.kv_offloading_size else ""
        mode = "" if self.mode == "aggregated" else f"-{self.mode}"
        return f"{self.engine}-{self.chip}-{self.quant}-{par}{seqs}{cpu}{mode}".replace(".", "")

    def options(self, replicas: int = 1) -> EngineOptions:
        """The deployment as the engine builds it (what the fleet file declares)."""
        return EngineOptions(name=self.name, model=self.model, quant=self.quant, chip=self.chip,
                             engine=self.engine, count=self.count,
                             tp=None if self.count else self.tp,
                             pp=None if self.count else self.pp, ep=self.ep,
                             max_num_seqs=self.max_num_seqs, max_model_len=self.max_model_len,
                             replicas=replicas, data_parallel_size=self.dp,
                             kv_offloading_size=self.kv_offloading_size,
                             hf_overrides=self.hf_overrides, pooler_config=self.pooler_config)


@dataclass(frozen=True)
class SearchSpace:
    """The grid: every combination is a config (incompatible ones are pruned, not errors)."""

    model: str
    chips: tuple[str, ...]
    engines: tuple[str, ...]
    quants: tuple[str, ...]
    tps: tuple[int, ...] = (1, 2, 4, 8)
    pps: tuple[int, ...] = (1,)
    eps: tuple[int | None, ...] = (None,)
    dps: tuple[int, ...] = (1,)
    offloads: tuple[float | None, ...] = (None,)  # CPU KV tier sizes, GiB (None: no tier)
    max_num_seqs: tuple[int | None, ...] = (None,)
    modes: tuple[str, ...] = MODES
    max_replicas: int = 64
    hf_overrides: str | None = None  # every config's (a generative model served converted)
    pooler_config: str | None = None  # every config's (how a pooling model pools)


@dataclass(frozen=True)
class WorkloadShape:
    """What the analytic model needs of the workload: offered requests per second, prompt
    tokens a request prefills when nothing is cached, output tokens (mean, max) and the
    longest context one request needs (None: unknown, e.g. a trace)."""

    rate: float
    prompt: int
    output_mean: float
    output_max: int
    context: int | None
    # prompts at quantiles 0, 0.01, ..., 1 of the run's requests, each no longer than the
    # longest of the ceil(q·N) shortest (None: every prompt is `prompt`; see `prompt_at`)
    prompt_quantiles: tuple[int, ...] | None = None

    def prompt_at(self, q: float) -> int:
        """A prompt no longer than the longest of the q·N shortest requests' prompts."""
        if self.prompt_quantiles is None:
            return self.prompt
        return self.prompt_quantiles[math.floor(q * 100 + 1e-9)]


def prompt_quantiles(prompts: Sequence[int]) -> tuple[int, ...]:
    """`WorkloadShape.prompt_quantiles` of these prompts (at least one)."""
    ordered, n = sorted(prompts), len(prompts)
    return tuple(ordered[max(0, math.ceil(i * n / 100) - 1)] for i in range(101))


PERCENTILE_SHARE = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99, "mean": 1.0}


def prompt_floor(work: WorkloadShape, slo: PlanSlo) -> int:
    """The prompt a lone request's latency floor is taken at: that of the smallest share of
    requests the SLO constrains (the goodput fraction of its per-request bounds, a
    statistic's percentile), capped at the mean prompt (a mean statistic's floor, and the
    rule before lengths varied)."""
    shares = [slo.goodput] if slo.bounds else []
    shares += [PERCENTILE_SHARE[stat] for _, stat in slo.stats]
    return min(work.prompt, work.prompt_at(min(shares, default=1.0)))


@dataclass(frozen=True)
class Sized:
    """A config the analytic model accepts: its price per replica-hour, the least replica
    count worth simulating and the figures that bound came from."""

    config: Config
    usd_per_hour: float
    chips: int
    min_replicas: int
    replica_output_tokens_per_s: float
    replica_prefill_tokens_per_s: float
    batch: int
    output_lb: int = 1  # replicas the offered output tokens need (the decode bound)
    prefill_lb: int = 1  # replicas the offered prompt tokens need (the prefill bound)


def output_mean(osl: int, ignore_eos: bool, eos_mean: float) -> float:
    """Expected output tokens: `osl` when EOS is ignored, else E[min(G, osl)] for the engine's
    geometric EOS draw with mean `eos_mean` (server.engine.mock_model.OutputLengths)."""
    if ignore_eos:
        return float(osl)
    q = 1 - 1 / eos_mean
    return (1 - q ** osl) * eos_mean


def expand(space: SearchSpace) -> Iterator[Config]:
    """Every combination the catalogue allows (engine on the chip's class, quant family). On an
    engine whose ranks share a MoE model's experts, a shape of several ranks shards them over
    all tp × dp chips whatever `ep` says (vLLM's `--enable-expert-parallel` with `-dp`), so
    its `ep` is dropped and the shape yielded once."""
    moe = catalog.get_model(space.model).is_moe
    seen: set[Config] = set()
    for c in _combinations(space):
        if c.dp > 1 and c.ep and moe and catalog.get_engine(c.engine).dp_shares_experts:
            c = dataclasses.replace(c, ep=None)
        if c not in seen:
            seen.add(c)
            yield c


def _combinations(space: SearchSpace) -> Iterator[Config]:
    for chip_id in space.chips:
        chip = catalog.get_chip(chip_id)
        for engine_id in space.engines:
            engine = catalog.get_engine(engine_id)
            if chip.chip_class not in engine.chip_classes:
                continue
            for quant_id in space.quants:
                if catalog.get_quant(quant_id).family not in engine.quant_families:
                    continue
                shapes = [(1, 1, None, 1)]  # SRAM and unified chips: sized by place
                if chip.placement == "sharded":
                    shapes = [(tp, pp, ep, dp) for tp in space.tps for pp in space.pps
                              for ep in space.eps for dp in space.dps]
                for (tp, pp, ep, dp) in shapes:
                    for seqs in space.max_num_seqs:
                        for mode in space.modes:
                            for gib in space.offloads:
                                yield Config(chip_id, engine_id, quant_id, space.model, tp,
                                             pp, ep, None, seqs, None, mode, dp, gib,
                                             space.hf_overrides, space.pooler_config)


def check_not_empty(space: SearchSpace) -> None:
    """ValueError when the lists allow no combination: an empty search is a usage error."""
    if next(expand(space), None) is None:
        runs = sorted({e for c in space.chips for e in space.engines
                       if catalog.get_chip(c).chip_class in catalog.get_engine(e).chip_classes})
        what = (f"no quantisation of {', '.join(space.quants)} runs on {', '.join(runs)}" if runs
                else f"no engine of {', '.join(space.engines)} runs on {', '.join(space.chips)}")
        raise ValueError(f"{what}: the search space is empty")


def rank_problem(config: Config) -> str:
    """Why this config's data-parallel shape is not searched ("" when it is): ranks are a
    shape of their own only where they share a MoE model's experts (`dp_shares_experts`); on
    such an engine, experts over more chips than TP's are its ranks (`dp`), not `ep`."""
    engine, model = catalog.get_engine(config.engine), catalog.get_model(config.model)
    shared = model.is_moe and engine.dp_shares_experts
    if config.dp > 1 and not shared:
        why = "a dense model's" if not model.is_moe else f"{engine.name}'s"
        return (f"dp {config.dp}: {why} data-parallel ranks are copies of the deployment, "
                "which the replica count searches")
    if shared and config.ep and config.ep > config.tp:
        return (f"ep {config.ep} > tp {config.tp}: {engine.name} shards experts over more "
                f"chips than TP's as data-parallel ranks (search --dp "
                f"{max(2, config.ep // config.tp)} for that shape)")
    return ""


def size(config: Config, work: WorkloadShape, slo: PlanSlo) -> Sized | str:
    """The analytic verdict on one config: `Sized`, or why it is pruned (a sentence). A
    config of `dp` ranks is judged by one rank (its latencies are the replica's) and priced
    and rated as `dp` of them (balanced DP, as `devices.place` costs a rank)."""
    if problem := rank_problem(config):
        return problem
    ranks = config.dp
    chip = catalog.get_chip(config.chip)
    if chip.placement == "sram":  # chips for the weights plus KV of the batch at the context
        ctx = 1 << math.ceil(math.log2(work.context or 2048))
        seqs = config.max_num_seqs or engine_defaults(config.engine, config.chip)[1] or 256
        probe = config.options().spec()
        n = chips_needed(probe, served_model(probe),
                         catalog.get_quant(config.quant), chip, seqs, ctx)
        config = dataclasses.replace(config, count=n, max_model_len=ctx)
    spec: DeploymentSpec = config.options().spec()
    try:
        placement = place(spec, ranks=ranks)
    except DeviceError as e:
        return f"does not place: {e}"
    if config.kv_offloading_size:  # the CPU tier as the build makes it (or why it cannot)
        try:
            host_tier(OffloadConfig.resolve(config.kv_offloading_size, "native", None, None),
                      placement, scheduler_config(config.options(), placement))
        except ValueError as e:
            return str(e)

    def point(prompt: int, output: int, batch: int) -> dict[str, Any]:
        return estimate(spec, prompt, output, batch, ranks=ranks)  # one rank's

    need = work.prompt + work.output_max
    if work.context and work.context > placement.max_context:
        return f"context {work.context} > max context {placement.max_context}"
    batch = max(1, min(spec.max_batch, placement.max_concurrency(min(need, placement.max_context))))
    alone = point(work.prompt, work.output_max, 1)
    if not alone["fits"]:
        return f"does not fit one request: {alone['error']}"
    low = prompt_floor(work, slo)
    floor = floors(alone if low == work.prompt else point(low, work.output_max, 1), work)
    for metric, bound in slo.bounds.items():
        if floor[metric] > bound:
            return f"unloaded {metric} {floor[metric] * 1e3:.1f} ms > {bound * 1e3:g} ms"
    for (metric, stat), bound in slo.stats.items():
        if metric in floor and floor[metric] > bound:
            return f"unloaded {metric} {floor[metric] * 1e3:.1f} ms > {stat} bound " \
                   f"{bound * 1e3:g} ms"
    output = work.output_max
    full = point(work.prompt, output, batch)
    if not full["fits"]:  # KV for `batch` at the longest context: the mean context fits
        output = max(1, round(work.output_mean))
        full = point(work.prompt, output, batch)
    if not full["fits"]:
        return f"does not fit a batch of {batch}: {full['error']}"
    bound = tpot_bound(slo)
    if bound is not None and full["tpot_s"] > bound:  # the largest batch within the bound
        lo, hi = 1, batch  # estimate(lo) is within it (the floor above), estimate(hi) is not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if point(work.prompt, output, mid)["tpot_s"] <= bound \
                else (lo, mid)
        batch = lo
        full = point(work.prompt, output, batch)
    cap = full["output_tokens_per_s"] * ranks  # every rank at that batch
    output_lb = math.ceil(work.rate * work.output_mean * LB_SLACK / cap - 1e-9)
    prefill = (full["prefill_tokens_per_s"] or 0.0) * ranks  # prompt tokens not cached: all
    prefill_lb = math.ceil(work.rate * work.prompt * LB_SLACK / prefill - 1e-9) if prefill \
        else 0
    return Sized(config, usd_per_hour=placement.plan.rank_usd_per_s * 3600 * ranks,
                 chips=placement.chips * ranks,
                 min_replicas=max(1, output_lb, prefill_lb), replica_output_tokens_per_s=cap,
                 replica_prefill_tokens_per_s=prefill or 0.0, batch=batch,
                 output_lb=max(1, output_lb), prefill_lb=max(1, prefill_lb))


def tpot_bound(slo: PlanSlo) -> float | None:
    """The tightest bound on time per output token the SLO sets (tpot or itl), if any."""
    bounds = [v for k, v in slo.bounds.items() if k == "tpot"]
    bounds += [v for (m, _), v in slo.stats.items() if m in ("tpot", "itl")]
    return min(bounds) if bounds else None


def floors(alone: dict[str, Any], work: WorkloadShape) -> dict[str, float]:
    """A lone request's latencies (`estimate` at batch 1): no load makes them shorter."""
    ttft, tpot = alone["ttft_s"] or 0.0, alone["tpot_s"]
    fixed = work.output_mean == work.output_max  # EOS ignored: every request is that long
    return {"ttft": ttft, "tpot": tpot, "itl": tpot,
            "e2e": ttft + (tpot * (work.output_max - 1) if fixed else 0.0)}


def configs(space: SearchSpace, work: WorkloadShape,
            slo: PlanSlo) -> tuple[list[Sized], list[tuple[Config, str]]]:
    """(the configs worth simulating, the pruned ones with why), each in a stable order."""
    kept: list[Sized] = []
    pruned: list[tuple[Config, str]] = []
    for c in expand(space):
        verdict = size(c, work, slo)
        if isinstance(verdict, str):
            pruned.append((c, verdict))
        elif verdict.min_replicas > space.max_replicas:
            pruned.append((c, f"needs at least {verdict.min_replicas} replicas "
                              f"(> --max-replicas {space.max_replicas})"))
        else:
            kept.append(verdict)
    return kept, pruned


def check_ids(kind: str, given: Sequence[str], known: Sequence[str]) -> None:
    """ValueError naming every unknown id (a typo is never silently an empty search)."""
    bad = [g for g in given if g not in known]
    if bad:
        raise ValueError(f"unknown {kind} {', '.join(bad)}; known: {', '.join(known)}")
