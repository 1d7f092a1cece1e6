"""Sweeps for `doppelchip load`: the same workload at growing rates (open loop) or
concurrencies (closed loop), until the target saturates; the report names the bottleneck
there from the engine's counters (sim.bottleneck).

A sweep runs its points through `run_once(args, spec, slo) -> (summary, results)`, which
the caller passes in (`doppelchip load`'s runner, against a gRPC server or in virtual time):
the sweep itself never talks to a server."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable
from typing import Any

from clients.report import RequestResult
from clients.steady import WINDOW_SERVICE_TIMES, steady_state
from sim.bottleneck import bottleneck

RunOnce = Callable[[argparse.Namespace, Any, dict[str, float]],
                   tuple[dict[str, Any], list[RequestResult]]]


class SweepError(ValueError):
    """The sweep's flags are wrong; the message says which."""


def sweep(args: argparse.Namespace, spec, slo: dict[str, float], run_once: RunOnce
          ) -> tuple[dict[str, Any], list[RequestResult]]:
    if args.sweep_rates is not None and args.sweep_concurrency is not None:
        raise SweepError("sweep rates or concurrencies, not both")
    if args.sweep_rates is not None and getattr(args, "concurrency", None) is not None:
        raise SweepError("--sweep-rates runs open loop at each rate: not with --concurrency "
                         "(a closed-loop sweep is --sweep-concurrency)")
    if args.sweep_concurrency is not None:
        return sweep_concurrency(args, spec, slo, run_once)
    return sweep_rates(args, spec, slo, run_once)


MAX_REQUESTS_PER_POINT = 6000  # the adaptive count's bound (when --num-requests is lower)
MAX_ATTEMPTS = 3  # runs per rate: the first, then at most two with more requests


def sweep_rates(args: argparse.Namespace, spec, slo: dict[str, float], run_once: RunOnce
                ) -> tuple[dict[str, Any], list[RequestResult]]:
    """Run at each rate until the target saturates: achieved throughput stops following the
    offered rate (clients.steady: below 90% of it over the steady-state window, or the queue
    grows over the run) or errors appear. `--num-requests` is a minimum per rate: a run whose
    window spans fewer than 10 median service times is rerun with enough requests for it,
    at most MAX_ATTEMPTS runs and max(MAX_REQUESTS_PER_POINT, --num-requests) requests. The
    highest rate meeting the SLO is the highest unsaturated one whose goodput (requests per
    second within the SLO) reaches --slo-attainment of the offered rate."""
    if args.sweep_rates == "auto":
        start = args.rate if args.rate != float("inf") else 1.0
        rates = [start * 2**k for k in range(12)]
    else:
        try:
            rates = [float(r) for r in args.sweep_rates.split(",") if r.strip()]
        except ValueError:
            raise SweepError(f"bad --sweep-rates {args.sweep_rates!r}") from None
        if not rates or any(not r > 0 or r == float("inf") for r in rates):
            raise SweepError("--sweep-rates needs finite rates > 0")
    minimum = spec.num_requests
    cap = max(MAX_REQUESTS_PER_POINT, minimum)
    points, last_results, saturated, service = [], [], None, 0.0
    for rate in rates:
        n = minimum
        if args.duration is not None and args.num_requests is None:
            n = max(1, round(rate * args.duration))  # the same duration at every rate
        n = min(cap, max(n, _needed(rate, service)))  # the last rate's service time as a guess
        for attempt in range(1, MAX_ATTEMPTS + 1):
            summary, results = run_once(args, dataclasses.replace(spec, rate=rate,
                                                                  num_requests=n), slo)
            steady = steady_state(results, slo)
            if steady.long_enough or n >= cap or attempt == MAX_ATTEMPTS:
                break
            n = min(cap, max(2 * n, _needed(rate, steady.service_s)))
        service = steady.service_s
        point = {k: v for k, v in summary.items() if k != "warnings"} | {
            "offered_rate": rate, "num_requests": n, "runs": attempt,
            "steady": steady.as_dict()}
        point_saturated = bool(summary["errors"]) or steady.saturated
        point["saturated"] = point_saturated
        point["meets_slo"] = bool(slo) and not point_saturated and \
            steady.goodput_fraction >= args.slo_attainment
        if point_saturated:
            point["bottleneck"] = bottleneck(summary)
        points.append(point)
        last_results = results
        if point_saturated:
            saturated = rate
            break
    out = _result(points, "offered_rate", "rate", saturated, slo, args.slo_attainment)
    out["requests_per_point"] = {
        "minimum": minimum, "max": cap, "max_runs": MAX_ATTEMPTS,
        "rule": f"each rate's steady-state window spans >= {WINDOW_SERVICE_TIMES:g} median "
                f"service times; --num-requests is the minimum, raised to "
                f"rate x {WINDOW_SERVICE_TIMES * 1.25:g} x the service time (at most {cap})"}
    if saturated is not None:
        out["bottleneck"] = points[-1].get("bottleneck")
    best = out.get("max_rate_meeting_slo")
    at = next((p for p in points if p["offered_rate"] == best), None)
    if at is not None:
        out["usd_per_mtok_at_max_rate"] = at.get("usd_per_mtok")
    return out, last_results


def _needed(rate: float, service_s: float) -> int:
    """Requests whose arrivals span the window and its warm-up (a quarter more); none before
    a service time is known (the first rate), and the most there can be past a float's."""
    if service_s <= 0:
        return 0
    need = rate * WINDOW_SERVICE_TIMES * 1.25 * service_s
    return math.ceil(need) if math.isfinite(need) else sys.maxsize


SATURATION_GAIN = 1.05  # a concurrency saturates when throughput gains less than 5%


def sweep_concurrency(args: argparse.Namespace, spec, slo: dict[str, float],
                      run_once: RunOnce) -> tuple[dict[str, Any], list[RequestResult]]:
    """Closed loop at each concurrency until throughput stops growing (less than
    SATURATION_GAIN over the previous point) or errors appear; report the highest
    concurrency meeting the SLO."""
    try:
        levels = [int(c) for c in args.sweep_concurrency.split(",") if c.strip()]
    except ValueError:
        raise SweepError(f"bad --sweep-concurrency {args.sweep_concurrency!r}") from None
    if not levels or min(levels) < 1:
        raise SweepError("--sweep-concurrency needs integers >= 1")
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
            point["bottleneck"] = bottleneck(summary)
            break
    out = _result(points, "concurrency", "concurrency", saturated, slo, args.slo_attainment)
    if saturated is not None:
        out["bottleneck"] = points[-1].get("bottleneck")
    return out, last_results


def _result(points: list[dict[str, Any]], key: str, what: str, saturated: float | None,
            slo: dict[str, float], attainment: float) -> dict[str, Any]:
    """The sweep's summary: every point, where it saturated, and the highest `key` whose share
    of requests meeting the SLO reaches `attainment`."""
    passing = [p[key] for p in points
               if p.get("meets_slo", bool(slo) and p.get("goodput", {}).get("fraction", 0)
                        >= attainment)]
    out = {"deployment": points[0].get("deployment", ""), "sweep": points,
           "saturated_at": saturated, f"max_{what}_meeting_slo": max(passing, default=None)}
    if slo:
        out["slo"] = slo
    return out


def _with(args: argparse.Namespace, **changes: Any) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), **changes})
