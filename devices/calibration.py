"""Efficiency factors per (engine, chip class), fitted from hardware.md's calibration points.

Nothing here is typed in by hand: ``fit(points)`` derives every factor from the table in
``devices/catalog/calibration.toml`` (the only published measurements the model may be fitted
to), so a test can refit with a point left out and predict it. Each point names a deployment
and a llama-bench-like setting; the fit never looks at which model or chip a point used beyond
its (engine, chip class) group.

How each factor is derived (model: decode step t = M/bw_eff + K·kernel_s + F; prefill step
t = C/flop_eff + K·kernel_s + F, where M = bytes / peak bandwidth, C = FLOPs / peak FLOP/s,
K = kernel launches and F = link time, all computed by the cost model at unit efficiency):

1. Decode points of one group, two or more with different M/K: least squares for
   (1/bw_eff, kernel_s). (llama.cpp on Apple: three M2 Ultra points, F16/Q8_0/Q4_0.)
2. A single decode point: bw_eff is taken from the same engine's multi-point fit on another
   class (the same kernels stream memory), or the median of all multi-point fits; kernel_s
   is what is left: (t − F − M/bw_eff) / K. On SRAM chips M is microseconds, so the point
   sets the fixed overhead almost alone (Groq, Cerebras).
3. Prefill points: flop_eff = C / (t − K·kernel_s − F), geometric mean over the group.
4. Throughput-under-load points marked ``fit`` set one factor by bisection, so that the
   end-to-end throughput of ``estimate`` at the point's batch (capped by KV capacity)
   matches: flop_eff when a single-stream decode point already informs bandwidth and
   overhead on that chip class (TensorRT-LLM 128/128 on H100: the H100 llama.cpp point),
   otherwise the factor the throughput is most sensitive to (each improved by 10% in turn;
   JetStream on v5e-8, memory-bound decode → bw_eff).
5. Groups with no point borrow each missing factor: from the engines in the engine's
   ``borrow_from`` list, in order (same chip class first, then another class), then from the
   same engine on another class, then the median over fitted groups; a borrowed flop_eff is
   multiplied by the engine's stated ``flop_eff_scale`` assumption (MLX).
"""

from __future__ import annotations

import math
import statistics
import tomllib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from devices import catalog
from devices.cost import step_cost
from devices.deployment import DeploymentSpec
from devices.estimate import decode_contexts, estimate, prefill_steps
from devices.factors import Factors
from devices.placement import place


@dataclass(frozen=True)
class Point:
    """One published measurement (hardware.md, "Calibration points")."""

    id: str
    engine: str
    chip: str
    model: str
    quant: str
    kind: str  # 'decode' | 'prefill' | 'throughput'
    value: float  # tokens per second (per user for decode/prefill; aggregate for throughput)
    source: str
    prompt: int = 512
    output: int = 128
    batch: int = 1
    count: int | None = None
    fit: bool = True  # False: checked later (simulate), not used to set a factor
    tolerance: float = 0.20

    @property
    def spec(self) -> DeploymentSpec:
        return DeploymentSpec(
            model=self.model, quant=self.quant, chip=self.chip, engine=self.engine,
            count=self.count,
        )

    @property
    def group(self) -> tuple[str, str]:
        return (self.engine, catalog.get_chip(self.chip).chip_class)


def load_points() -> tuple[Point, ...]:
    """The calibration table, ``devices/catalog/calibration.toml``."""
    path = Path(catalog.__file__).parent / "calibration.toml"
    with path.open("rb") as f:
        return tuple(Point(**raw) for raw in tomllib.load(f)["points"])


POINTS: tuple[Point, ...] = load_points()


class _Table(dict):
    """A factor table that answers UNIT-like factors for groups not yet fitted."""

    def __init__(self, base: dict[tuple[str, str], Factors], default: Factors) -> None:
        super().__init__(base)
        self.default = default

    def __missing__(self, key: tuple[str, str]) -> Factors:
        return self.default


_MEM_ONLY = Factors(1.0, 1e12, 0.0, "memory roofline")
_FLOP_ONLY = Factors(1e12, 1.0, 0.0, "compute roofline")


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
    from devices.deployment import BatchShape

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


@cache
def fit(points: tuple[Point, ...] = POINTS) -> dict[tuple[str, str], Factors]:
    """Fit the factor table from ``points`` (pure; cached per tuple of points)."""
    used = [p for p in points if p.fit]
    groups: dict[tuple[str, str], list[Point]] = defaultdict(list)
    for p in used:
        groups[p.group].append(p)
    feats = {p.id: features(p) for p in used if p.kind != "throughput"}
    bw: dict[tuple[str, str], float] = {}
    ks: dict[tuple[str, str], float] = {}
    fl: dict[tuple[str, str], float] = {}
    origin: dict[tuple[str, str], list[str]] = defaultdict(list)
    multi: dict[str, float] = {}  # engine -> bw_eff of a multi-point fit
    for g, pts in groups.items():  # rule 1
        dec = [(feats[p.id][0], feats[p.id][2], 1 / p.value - feats[p.id][3])
               for p in pts if p.kind == "decode"]
        if len(dec) >= 2:
            a, c = _lsq(dec)
            if a >= 1.0 and c >= 0:
                bw[g], ks[g] = 1 / a, c
                multi[g[0]] = bw[g]
                origin[g].append(f"bw_eff, kernel_s: least squares over {len(dec)} decode points")
    prior_all = statistics.median(multi.values()) if multi else 1.0
    for g, pts in groups.items():  # rule 2
        dec = [p for p in pts if p.kind == "decode"]
        if g in bw or not dec:
            continue
        m, _, k, f = feats[dec[0].id]
        e = multi.get(g[0], prior_all)
        c = (1 / dec[0].value - f - m / e) / k
        if c < 0:
            c, e = 0.0, m / (1 / dec[0].value - f)
        bw[g], ks[g] = e, c
        origin[g].append(f"kernel_s from {dec[0].id} with bw_eff prior {e:.3f}")
    for g, pts in groups.items():  # rule 3
        implied = []
        for p in pts:
            if p.kind != "prefill":
                continue
            _, comp, k, f = feats[p.id]
            t = p.prompt / p.value - k * ks.get(g, 0.0) - f
            implied.append(comp / t)
        if implied:
            fl[g] = math.exp(sum(math.log(x) for x in implied) / len(implied))
            origin[g].append(f"flop_eff: {len(implied)} prefill point(s)")
    table = _complete(bw, ks, fl, origin)
    for p in used:  # rule 4
        if p.kind == "throughput" and p.group not in fl:
            has_decode = any(q.kind == "decode" and q.group[1] == p.group[1] for q in used)
            name, value = _bisect(p, table, has_decode)
            {"bw_eff": bw, "flop_eff": fl, "kernel_s": ks}[name][p.group] = value
            origin[p.group].append(f"{name}: bisection on {p.id}")
            table = _complete(bw, ks, fl, origin)
    return table


def _borrow(
    have: dict[tuple[str, str], float], engine: str, cls: str
) -> tuple[float, str] | None:
    """Rule 5: the first fitted value among borrow_from engines (same class first), the same
    engine on another class, then the median of fitted groups."""
    eng = catalog.get_engine(engine)
    for other in eng.borrow_from:
        if (other, cls) in have:
            return have[(other, cls)], f"{other} on {cls}"
        for (e, c), v in sorted(have.items()):
            if e == other:
                return v, f"{other} on {c}"
    family = cls.split("-")[0]  # prefer a sibling class of the same vendor
    for (e, c), v in sorted(have.items(), key=lambda kv: kv[0][1].split("-")[0] != family):
        if e == engine and c != cls:
            return v, f"{engine} on {c}"
    if have:
        return statistics.median(have.values()), "median of fitted groups"
    return None


Group = tuple[str, str]


def _complete(
    bw: dict[Group, float], ks: dict[Group, float], fl: dict[Group, float],
    origin: dict[Group, list[str]],
) -> dict[Group, Factors]:
    """Fill every (engine, class) the catalogue supports (rule 5)."""
    out = {}
    classes = set(catalog.chip_classes())
    for eng in catalog.list_engines():
        for cls in eng.chip_classes:
            if cls not in classes:
                continue
            g = (eng.id, cls)
            notes = list(origin.get(g, []))
            vals = []
            for name, have in (("bw_eff", bw), ("kernel_s", ks), ("flop_eff", fl)):
                if g in have:
                    vals.append(have[g])
                    continue
                got = _borrow(have, eng.id, cls)
                v, src = got if got else (1.0 if name != "kernel_s" else 0.0, "default")
                if name == "flop_eff" and eng.flop_eff_scale != 1.0:
                    v *= eng.flop_eff_scale
                    src += f" × {eng.flop_eff_scale} (assumption)"
                vals.append(v)
                notes.append(f"{name} borrowed from {src}")
            out[g] = Factors(bw_eff=vals[0], kernel_s=vals[1], flop_eff=vals[2],
                             origin="; ".join(notes))
    return out


def _bisect(
    p: Point, table: dict[tuple[str, str], Factors], class_has_decode: bool
) -> tuple[str, float]:
    """Rule 4: fit the factor the point's end-to-end throughput is most sensitive to."""
    base = table[p.group]

    def run(**kw: float) -> dict:
        t = dict(table)
        t[p.group] = replace(base, **kw)
        pl = place(p.spec, t)
        b = min(p.batch, pl.max_concurrency(p.prompt + p.output))
        return estimate(p.spec, p.prompt, p.output, b, factor_table=t)

    def sens(name: str) -> float:  # relative throughput change for a 10% better factor
        v = getattr(base, name)
        better = v / 1.1 if name == "kernel_s" else min(1.0, v * 1.1)
        return run(**{name: better})["end_to_end_tokens_per_s"]

    name = "flop_eff" if class_has_decode else max(("bw_eff", "flop_eff", "kernel_s"), key=sens)
    lo, hi = (0.0, 1e-3) if name == "kernel_s" else (0.02, 1.0)
    sign = -1 if name == "kernel_s" else 1  # throughput falls as kernel_s grows

    def rate(x: float) -> float:
        r = run(**{name: x})
        return sign * (r["end_to_end_tokens_per_s"] if r["fits"] else 0.0)

    target = sign * p.value
    if rate(hi) < target:
        return name, hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rate(mid) < target else (lo, mid)
    return name, (lo + hi) / 2


def fitted_factors() -> dict[tuple[str, str], Factors]:
    """The factor table used by default everywhere (fitted from every point)."""
    return fit(POINTS)


def without(point_id: str, points: Iterable[Point] = POINTS) -> tuple[Point, ...]:
    """The calibration table minus one point (for leave-one-out tests)."""
    return tuple(p for p in points if p.id != point_id)
