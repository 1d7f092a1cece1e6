"""The SLO a plan must meet, and the one check of a simulate summary against it.

Why a type of its own: `load --slo` knows per-request bounds only (`ttft=0.2`: a request
meets the SLO when its TTFT is at most 0.2 s, `--slo-attainment` the share that must); a
capacity planner also states percentiles of the fleet's distribution (`ttft_p99=0.3`) and the
goodput fraction. The syntax, terms joined by commas (seconds, except goodput):

- `ttft=S`, `tpot=S`, `e2e=S` — a per-request bound, exactly `load --slo`'s (parsed by
  `clients.report.parse_slo`); `simulate --slo` reports the share of requests meeting every
  per-request bound as `goodput.fraction`;
- `goodput=F` — that share must be at least F (default 0.9, `load --slo-attainment`'s);
- `ttft_p99=S` (any of ttft/tpot/itl/e2e with p50/p90/p95/p99/mean) — that statistic of the
  whole run's distribution, as `simulate` reports it, must be at most S.

Every request must also succeed: a candidate with any error (refused, too long) fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from clients.report import SLO_METRICS, parse_slo

STAT_METRICS = ("ttft", "tpot", "itl", "e2e")
STATS = ("p50", "p90", "p95", "p99", "mean")
DEFAULT_GOODPUT = 0.9


@dataclass(frozen=True)
class PlanSlo:
    """`bounds`: per-request bounds (metric → seconds); `goodput`: the share of requests that
    must meet all of them; `stats`: (metric, statistic) → seconds, on the run's distribution."""

    bounds: dict[str, float] = field(default_factory=dict)
    goodput: float = DEFAULT_GOODPUT
    stats: dict[tuple[str, str], float] = field(default_factory=dict)

    def simulate_flag(self) -> str:
        """The per-request bounds in `simulate --slo`'s (and `load --slo`'s) syntax."""
        return ",".join(f"{k}={v:g}" for k, v in self.bounds.items())

    def text(self) -> str:
        """The SLO in the syntax it was given in (canonical order)."""
        parts = [f"{k}={v:g}" for k, v in self.bounds.items()]
        if self.bounds:
            parts.append(f"goodput={self.goodput:g}")
        parts += [f"{m}_{s}={v:g}" for (m, s), v in self.stats.items()]
        return ",".join(parts)

    def latency_key(self) -> tuple[str, str]:
        """The latency a Pareto frontier plots against cost: the first statistic named, else
        the p99 of the first per-request bound's metric (ttft for `ttft=0.2,tpot=0.05`)."""
        if self.stats:
            return next(iter(self.stats))
        return (next(iter(self.bounds)), "p99")


def parse_plan_slo(text: str) -> PlanSlo:
    """`ttft=0.2,tpot=0.05,goodput=0.95,e2e_p99=4` → PlanSlo (ValueError saying why)."""
    plain: list[str] = []
    goodput = DEFAULT_GOODPUT
    stats: dict[tuple[str, str], float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        metric, _, stat = name.partition("_")
        if name == "goodput" or stat:
            try:
                number = float(value) if sep else float("nan")
            except ValueError:
                raise ValueError(f"bad SLO value in {part!r}: not a number") from None
            if not sep:
                raise ValueError(f"bad SLO term {part!r}: use NAME=VALUE")
            if not -math.inf < number < math.inf:
                raise ValueError(f"SLO bound {name} must be a finite number, got {value!r}")
            if name == "goodput":
                if not 0 < number <= 1:
                    raise ValueError(f"goodput must be in (0, 1], got {value}")
                goodput = number
                continue
            if metric not in STAT_METRICS or stat not in STATS:
                raise ValueError(f"bad SLO term {part!r}: a statistic is METRIC_STAT with "
                                 f"METRIC one of {', '.join(STAT_METRICS)} and STAT one of "
                                 f"{', '.join(STATS)}, e.g. ttft_p99=0.3")
            stats[(metric, stat)] = number
        else:
            plain.append(part)
    bounds = parse_slo(",".join(plain))
    for key, bound in [*bounds.items(), *((f"{m}_{s}", v) for (m, s), v in stats.items())]:
        if bound <= 0:
            raise ValueError(f"SLO bound {key} must be > 0 seconds, got {bound:g}")
    if not bounds and not stats:
        raise ValueError(f"an SLO needs at least one bound, e.g. ttft=0.2,tpot=0.05 (metrics: "
                         f"{', '.join(SLO_METRICS)}; statistics such as ttft_p99=0.3)")
    return PlanSlo(bounds, goodput, stats)


def check(summary: dict[str, Any], slo: PlanSlo) -> list[str]:
    """Why the simulate summary `summary` (run with `--slo slo.simulate_flag()`) misses the
    SLO: one sentence per term missed, none when it meets it."""
    misses = []
    errors = sum(summary["errors"].values())
    if errors:
        misses.append(f"{errors} requests failed ({', '.join(sorted(summary['errors']))})")
    if slo.bounds:
        got = summary["goodput"]["fraction"]
        if got < slo.goodput:
            misses.append(f"goodput {got:.1%} < {slo.goodput:.0%} meeting {slo.simulate_flag()}")
    for (metric, stat), bound in slo.stats.items():
        value = summary[f"{metric}_s"][stat]
        if value > bound:
            misses.append(f"{metric} {stat} {value * 1e3:.1f} ms > {bound * 1e3:g} ms")
    return misses
