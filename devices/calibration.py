"""Efficiency factors per (engine, chip class), fitted from hardware.md's calibration points.

Nothing here is typed in by hand: ``fit(points)`` derives every factor from the table in
``devices/catalog/calibration.toml`` (the only published measurements the model may be fitted
to), so a test can refit with a point left out and predict it. Each point names a deployment
and a llama-bench-like setting; the fit never looks at which model or chip a point used beyond
its (engine, chip class) group. Every factor records its :class:`~devices.factors.Provenance`.

How each factor is derived (model: decode step t = M/bw_eff + K·kernel_s + F; prefill step
t = C/flop_eff + K·kernel_s + F, where M = bytes / peak bandwidth, C = FLOPs / peak FLOP/s,
K = kernel launches and F = link time, all computed by the cost model at unit efficiency):

1. Decode points of one group, two or more with different M/K: least squares for
   (1/bw_eff, kernel_s). (llama.cpp on Apple: three M2 Ultra points, F16/Q8_0/Q4_0.)
2. A single decode point: bw_eff is borrowed from the same engine's multi-point fit on another
   class (the same kernels stream memory), or the median of all multi-point fits; kernel_s
   is what is left: (t − F − M/bw_eff) / K. On SRAM chips M is microseconds, so the point
   sets the fixed overhead almost alone (Groq, Cerebras).
3. Prefill points: flop_eff = C / (t − K·kernel_s − F), geometric mean over the group.
4. Throughput-under-load points set one factor per group, by least squares on the log error
   of ``estimate``'s end-to-end throughput at each point's batch (capped by KV capacity):
   flop_eff when a single-stream decode point already informs bandwidth and overhead on that
   chip class (TensorRT-LLM on H100: the H100 llama.cpp point), otherwise the factor the
   throughput is most sensitive to (JetStream on v5e-8, memory-bound decode → bw_eff).
5. Groups with no point borrow each missing factor: from the engines in the engine's
   ``borrow_from`` list, in order (same chip class first, then another class), then from the
   same engine on another class, then the median over fitted groups; a borrowed flop_eff is
   multiplied by the engine's stated ``flop_eff_scale`` assumption (MLX).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from functools import cache

from devices import catalog
from devices.calibration_cache import cached_fit
from devices.cost import step_cost
from devices.deployment import BatchShape
from devices.estimate import decode_contexts, estimate, prefill_steps
from devices.factors import FACTOR_NAMES, Factors, Provenance
from devices.placement import place
from devices.points import POINTS, Group, Point, load_points

__all__ = ["POINTS", "Group", "Point", "features", "fit", "fitted_factors", "load_points",
           "throughput_at", "without"]


class _Table(dict):
    """A factor table that answers a fixed default for groups not yet fitted."""

    def __init__(self, base: dict[Group, Factors], default: Factors) -> None:
        super().__init__(base)
        self.default = default

    def __missing__(self, key: Group) -> Factors:
        return self.default


_MEM_ONLY = Factors(1.0, 1e12, 0.0)
_FLOP_ONLY = Factors(1e12, 1.0, 0.0)


def features(p: Point) -> tuple[float, float, float, float]:
    """(M, C, K, F) of the point's measured step, at unit efficiency (see module doc)."""
    mem_pl = place(p.spec, _Table({}, _MEM_ONLY))
    flop_pl = place(p.spec, _Table({}, _FLOP_ONLY))
    if p.kind == "prefill":
        shapes = prefill_steps(mem_pl, p.prompt, 1)
        mem = [step_cost(mem_pl, s) for s in shapes]
        comp = [step_cost(flop_pl, s) for s in shapes]
        k = sum(c.kernels for c in mem)
        f = sum(c.link_s for c in mem)
        return sum(c.seconds for c in mem) - f, sum(c.seconds for c in comp) - f, k, f
    ctxs = decode_contexts(p.prompt, p.output)
    mem = [step_cost(mem_pl, BatchShape(decode=(c,))) for c in ctxs]
    comp = [step_cost(flop_pl, BatchShape(decode=(c,))) for c in ctxs]
    n = len(ctxs)
    f = sum(c.link_s for c in mem) / n
    k = sum(c.kernels for c in mem) / n
    return sum(c.seconds for c in mem) / n - f, sum(c.seconds for c in comp) / n - f, k, f


def _lsq(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares for t = a·M + c·K over rows (M, K, t); returns (a, c)."""
    smm = sum(m * m for m, _, _ in rows)
    skk = sum(k * k for _, k, _ in rows)
    smk = sum(m * k for m, k, _ in rows)
    smt = sum(m * t for m, _, t in rows)
    skt = sum(k * t for _, k, t in rows)
    det = smm * skk - smk * smk
    return (smt * skk - skt * smk) / det, (skt * smm - smt * smk) / det


Fitted = dict[Group, tuple[float, Provenance]]


@cache
def fit(points: tuple[Point, ...] = POINTS) -> dict[Group, Factors]:
    """Fit the factor table from ``points`` (pure; cached per tuple of points)."""
    used = [p for p in points if p.fit]
    groups: dict[Group, list[Point]] = defaultdict(list)
    for p in used:
        groups[p.group].append(p)
    feats = {p.id: features(p) for p in used if p.kind != "throughput"}
    have: dict[str, Fitted] = {name: {} for name in FACTOR_NAMES}
    multi: dict[str, tuple[float, Group]] = {}  # engine -> bw_eff of a multi-point fit
    for g, pts in groups.items():  # rule 1
        dec = [p for p in pts if p.kind == "decode"]
        rows = [(feats[p.id][0], feats[p.id][2], 1 / p.value - feats[p.id][3]) for p in dec]
        if len(rows) >= 2:
            a, c = _lsq(rows)
            if a >= 1.0 and c >= 0:
                prov = Provenance("fitted", tuple(p.id for p in dec), note="least squares")
                have["bw_eff"][g], have["kernel_s"][g] = (1 / a, prov), (c, prov)
                multi[g[0]] = (1 / a, g)
    for g, pts in groups.items():  # rule 2
        dec = [p for p in pts if p.kind == "decode"]
        if g in have["bw_eff"] or not dec:
            continue
        m, _, k, f = feats[dec[0].id]
        if g[0] in multi:
            e, src = multi[g[0]]
            bw_prov = Provenance("borrowed", have["bw_eff"][src][1].points,
                                 f"{src[0]} on {src[1]}", "the same kernels stream memory")
        else:
            e = statistics.median(v for v, _ in multi.values()) if multi else 1.0
            bw_prov = Provenance("borrowed", (), "median of multi-point fits",
                                 "no multi-point fit for this engine")
        c = (1 / dec[0].value - f - m / e) / k
        if c < 0:  # the prior leaves no room for overhead: the point sets bw_eff instead
            c, e = 0.0, m / (1 / dec[0].value - f)
            bw_prov = Provenance("fitted", (dec[0].id,), note="kernel_s clamped at 0")
        have["bw_eff"][g] = (e, bw_prov)
        have["kernel_s"][g] = (c, Provenance("fitted", (dec[0].id,),
                                             note=f"with bw_eff {bw_prov.describe()}"))
    for g, pts in groups.items():  # rule 3
        pre = [p for p in pts if p.kind == "prefill"]
        implied = []
        for p in pre:
            _, comp, k, f = feats[p.id]
            t = p.prompt / p.value - k * have["kernel_s"].get(g, (0.0,))[0] - f
            implied.append(comp / t)
        if implied:
            value = math.exp(sum(math.log(x) for x in implied) / len(implied))
            have["flop_eff"][g] = (value, Provenance("fitted", tuple(p.id for p in pre),
                                                     note="geometric mean"))
    table = _complete(have)
    for g, pts in groups.items():  # rule 4
        thr = [p for p in pts if p.kind == "throughput"]
        if not thr or g in have["flop_eff"]:
            continue
        has_decode = any(q.kind == "decode" and q.group[1] == g[1] for q in used)
        name, value = _fit_throughput(thr, table, has_decode)
        have[name][g] = (value, Provenance("fitted", tuple(p.id for p in thr),
                                           note="least squares on log throughput"))
        table = _complete(have)
    return table


def _borrow(have: Fitted, engine: str, cls: str) -> tuple[float, Group | None]:
    """Rule 5: the first fitted value among the engine's borrow_from engines on this class,
    then on its nearest classes (catalogue ``[classes]``), then on any class; then the same
    engine on its nearest classes, on any other class; then the median of fitted groups."""
    eng = catalog.get_engine(engine)
    near = (cls, *catalog.nearest_classes(cls))
    for other in (*eng.borrow_from, engine):
        for c in near:
            if (other, c) in have and (other, c) != (engine, cls):
                return have[(other, c)][0], (other, c)
    for other in (*eng.borrow_from, engine):
        for (e, c), (v, _) in sorted(have.items()):
            if e == other and (e, c) != (engine, cls):
                return v, (e, c)
    if have:
        return statistics.median(v for v, _ in have.values()), None
    return math.nan, None


def _complete(have: dict[str, Fitted]) -> dict[Group, Factors]:
    """Fill every (engine, class) the catalogue supports (rule 5), with provenance."""
    out = {}
    classes = set(catalog.chip_classes())
    for eng in catalog.list_engines():
        for cls in eng.chip_classes:
            if cls not in classes:
                continue
            g = (eng.id, cls)
            vals, provs = [], []
            for name in FACTOR_NAMES:
                if g in have[name]:
                    v, prov = have[name][g]
                else:
                    v, src = _borrow(have[name], eng.id, cls)
                    if math.isnan(v):
                        v, prov = (0.0 if name == "kernel_s" else 1.0), Provenance("default")
                    elif src is None:
                        prov = Provenance("borrowed", (), "median of fitted groups")
                    else:
                        prov = Provenance("borrowed", have[name][src][1].points,
                                          f"{src[0]} on {src[1]}")
                    if name == "flop_eff" and eng.flop_eff_scale != 1.0:
                        v *= eng.flop_eff_scale
                        prov = replace(prov, note=f"× {eng.flop_eff_scale} (assumption)")
                vals.append(v)
                provs.append((name, prov))
            out[g] = Factors(bw_eff=vals[0], flop_eff=vals[1], kernel_s=vals[2],
                             provenance=tuple(provs))
    return out


def throughput_at(p: Point, table: dict[Group, Factors]) -> float:
    """``estimate``'s end-to-end throughput for a throughput point (0 if it does not fit)."""
    pl = place(p.spec, table)
    b = max(1, min(p.batch, pl.max_concurrency(p.prompt + p.output)))
    r = estimate(p.spec, p.prompt, p.output, b, factor_table=table)
    return r["end_to_end_tokens_per_s"] if r["fits"] else 0.0


def _fit_throughput(
    pts: list[Point], table: dict[Group, Factors], class_has_decode: bool
) -> tuple[str, float]:
    """Rule 4: the factor the points' throughputs are most sensitive to, by golden-section
    search of Σ log²(predicted / published) over its range."""
    g = pts[0].group
    base = table[g]

    def err(name: str, x: float) -> float:
        t = dict(table)
        t[g] = replace(base, **{name: x})
        total = 0.0
        for p in pts:
            got = throughput_at(p, t)
            total += math.log(max(got, 1e-9) / p.value) ** 2
        return total

    def sens(name: str) -> float:  # how much a 10% better factor moves the first point
        v = getattr(base, name)
        better = v / 1.1 if name == "kernel_s" else min(1.0, v * 1.1)
        t = dict(table)
        t[g] = replace(base, **{name: better})
        return throughput_at(pts[0], t)

    name = "flop_eff" if class_has_decode else max(("bw_eff", "flop_eff", "kernel_s"), key=sens)
    lo, hi = (math.log(1e-7), math.log(1e-3)) if name == "kernel_s" else (math.log(0.02), 0.0)
    ratio = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    for _ in range(48):
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        if err(name, math.exp(c)) <= err(name, math.exp(d)):
            b = d
        else:
            a = c
    return name, math.exp((a + b) / 2)


@cache
def fitted_factors() -> dict[Group, Factors]:
    """The factor table used by default everywhere (fitted from every point): read from the
    on-disk memo when its inputs are unchanged (``devices.calibration_cache``), else fitted
    and stored there; once per process either way."""
    return cached_fit(lambda: fit(POINTS))


def without(point_id: str, points: Iterable[Point] = POINTS) -> tuple[Point, ...]:
    """The calibration table minus one point (for leave-one-out)."""
    return tuple(p for p in points if p.id != point_id)
