"""Sweeps for `doppelchip load`: the same workload at growing rates (open loop) or
concurrencies (closed loop), until the target saturates."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from clients.report import RequestResult
from doppelchip.loadrun import LoadError, run_once


def sweep(args: argparse.Namespace, spec, slo: dict[str, float]
          ) -> tuple[dict[str, Any], list[RequestResult]]:
    if args.sweep_rates and args.sweep_concurrency:
        raise LoadError("sweep rates or concurrencies, not both")
    if args.sweep_concurrency:
        return sweep_concurrency(args, spec, slo)
    return sweep_rates(args, spec, slo)


SATURATION_TTFT = 3.0  # a rate saturates the target when median TTFT exceeds 3x the lightest's


def sweep_rates(args: argparse.Namespace, spec, slo: dict[str, float]
           ) -> tuple[dict[str, Any], list[RequestResult]]:
    """Run at each rate until the target saturates (errors, or queueing: median TTFT above
    SATURATION_TTFT × the lightest load's); report every point and the highest rate whose
    share of requests meeting the SLO reaches --slo-attainment."""
    if args.sweep_rates == "auto":
        start = args.rate if args.rate != float("inf") else 1.0
        rates = [start * 2**k for k in range(12)]
    else:
        try:
            rates = [float(r) for r in args.sweep_rates.split(",") if r.strip()]
        except ValueError:
            raise LoadError(f"bad --sweep-rates {args.sweep_rates!r}") from None
        if not rates or any(not r > 0 or r == float("inf") for r in rates):
            raise LoadError("--sweep-rates needs finite rates > 0")
    points, last_results, base_ttft, saturated = [], [], None, None
    for rate in rates:
        n = spec.num_requests
        if args.duration is not None and args.num_requests is None:
            n = max(1, round(rate * args.duration))  # the same duration at every rate
        point_spec = dataclasses.replace(spec, rate=rate, num_requests=n)
        summary, results = run_once(args, point_spec, slo)
        point = {k: v for k, v in summary.items() if k != "warnings"} | {"offered_rate": rate}
        points.append(point)
        last_results = results
        ttft = summary["ttft_s"]["p50"]
        base_ttft = ttft if base_ttft is None else base_ttft
        if summary["errors"] or ttft > SATURATION_TTFT * max(base_ttft, 1e-9):
            saturated = rate
            break
    return _result(points, "offered_rate", "rate", saturated, slo, args.slo_attainment), \
        last_results


SATURATION_GAIN = 1.05  # a concurrency saturates when throughput gains less than 5%


def sweep_concurrency(args: argparse.Namespace, spec, slo: dict[str, float]
                      ) -> tuple[dict[str, Any], list[RequestResult]]:
    """Closed loop at each concurrency until throughput stops growing (less than
    SATURATION_GAIN over the previous point) or errors appear; report the highest
    concurrency meeting the SLO."""
    try:
        levels = [int(c) for c in args.sweep_concurrency.split(",") if c.strip()]
    except ValueError:
        raise LoadError(f"bad --sweep-concurrency {args.sweep_concurrency!r}") from None
    if not levels or min(levels) < 1:
        raise LoadError("--sweep-concurrency needs integers >= 1")
    points, last_results, saturated = [], [], None
    for level in levels:
        summary, results = run_once(_with(args, concurrency=level), spec, slo)
        point = {k: v for k, v in summary.items() if k != "warnings"} | {"concurrency": level}
        points.append(point)
        last_results = results
        gain = (point["output_tokens_per_s"] / points[-2]["output_tokens_per_s"]
                if len(points) > 1 and points[-2]["output_tokens_per_s"] else float("inf"))
        if summary["errors"] or gain < SATURATION_GAIN:
            saturated = level
            break
    return _result(points, "concurrency", "concurrency", saturated, slo,
                   args.slo_attainment), last_results


def _result(points: list[dict[str, Any]], key: str, what: str, saturated: float | None,
            slo: dict[str, float], attainment: float) -> dict[str, Any]:
    """The sweep's summary: every point, where it saturated, and the highest `key` whose share
    of requests meeting the SLO reaches `attainment`."""
    passing = [p[key] for p in points
               if slo and p.get("goodput", {}).get("fraction", 0) >= attainment]
    out = {"deployment": points[0].get("deployment", ""), "sweep": points,
           "saturated_at": saturated, f"max_{what}_meeting_slo": max(passing, default=None)}
    if slo:
        out["slo"] = slo
    return out


def _with(args: argparse.Namespace, **changes: Any) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), **changes})
