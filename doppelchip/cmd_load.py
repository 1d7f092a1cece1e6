"""`doppelchip load`: one workload against a gRPC server (real time) or `sim:` (virtual time),
and the same report for both."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from doppelchip import exit_codes
from doppelchip.client_flags import add_client_security_args
from doppelchip.sim_flags import add_workload_args
from doppelchip.simulate_format import format_summary


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "load", help="load-test a server (or sim:) with a synthetic workload",
        description="Drive a target with a workload and report throughput, TTFT/TPOT/ITL/E2E "
        "percentiles, goodput under an SLO and errors by status code. TARGET is host:port "
        "of a doppelchip server (loopback) or sim:[FLEET.toml#]DEPLOYMENT for the same "
        "workload in virtual time. Latencies are measured from each request's scheduled send "
        "time (open loop), on the server's emulated timeline.",
    )
    p.add_argument("--target", default="127.0.0.1:50051",
                   help="host:port of a server, or sim:[FLEET.toml#]DEPLOYMENT "
                   "(default 127.0.0.1:50051)")
    p.add_argument("--deployment", default="",
                   help="deployment of a gRPC target (default: the fleet's default)")
    p.add_argument("--concurrency", type=int, default=None,
                   help="closed loop: at most N requests in flight, sent back to back "
                   "(default: open loop at --rate)")
    p.add_argument("--slo", default="", metavar="ttft=S,tpot=S,e2e=S",
                   help="latency SLO for goodput, in seconds, e.g. ttft=0.5,tpot=0.05")
    p.add_argument("--time-limit", type=float, default=3600.0,
                   help="stop after this many emulated seconds (default 3600)")
    p.add_argument("--sweep-rates", metavar="R1,R2,...|auto",
                   help="run the load at each rate in turn (auto: double from --rate, or 1, "
                   "until saturation); stops at saturation and reports the highest rate "
                   "meeting --slo")
    p.add_argument("--sweep-concurrency", metavar="N1,N2,...",
                   help="closed loop at each concurrency in turn, until throughput stops "
                   "growing; reports the highest concurrency meeting --slo")
    p.add_argument("--slo-attainment", type=float, default=0.9,
                   help="share of requests that must meet --slo for a rate to pass (0.9)")
    p.add_argument("--html", metavar="FILE",
                   help="write a self-contained HTML report with plots")
    p.add_argument("--progress", choices=["auto", "on", "off"], default="auto",
                   help="live progress bar on stderr (auto: when stderr is a terminal)")
    add_workload_args(p)
    add_client_security_args(p)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--output-json", metavar="FILE",
                   help="write the summary and every request's record as JSON")
    p.add_argument("--output-csv", metavar="FILE", help="write every request's record as CSV")
    p.set_defaults(func=cmd_load)


def run_load_command(args: argparse.Namespace) -> tuple[dict[str, Any], list]:
    """One run, or a sweep over rates or concurrencies: (summary, every request's result)."""
    from clients.report import parse_slo
    from doppelchip.loadrun import LoadError, check_target_flags, run_once
    from sim.sim_args import workload_from_args
    from sim.simulation import SimulationError

    check_target_flags(args)
    try:
        slo = parse_slo(args.slo)
        spec = workload_from_args(args)
    except (ValueError, SimulationError) as e:
        raise LoadError(str(e)) from e
    if args.concurrency is not None and args.concurrency < 1:
        raise LoadError("--concurrency must be >= 1")
    if not 0 < args.slo_attainment <= 1:
        raise LoadError(f"--slo-attainment must be in (0, 1], got {args.slo_attainment:g}")
    if (getattr(args, "sweep_rates", None) is not None  # ("" too: refused by the sweep)
            or getattr(args, "sweep_concurrency", None) is not None):
        from sim.sweep import SweepError, sweep

        try:
            return sweep(args, spec, slo, run_once)
        except SweepError as e:
            raise LoadError(str(e)) from e
    return run_once(args, spec, slo)


def cmd_load(args: argparse.Namespace) -> int:
    from doppelchip.loadrun import LoadError
    from doppelchip.outpaths import unwritable

    try:
        problem = unwritable([("--html", args.html), ("--output-json", args.output_json),
                              ("--output-csv", args.output_csv)])
        if problem:  # before the run, not after it
            raise LoadError(problem)
        summary, results = run_load_command(args)
    except LoadError as e:
        print(json.dumps({"error": str(e)}) if args.json else f"error: {e}", file=sys.stderr)
        import grpc

        # the server could not be reached or answered an error: a failure, not bad input
        return (exit_codes.FAILED if isinstance(e.__cause__, grpc.RpcError)
                else exit_codes.USAGE)
    if args.output_json or args.output_csv:
        from doppelchip.loadrun import write_outputs

        write_outputs(summary, results, args.output_json, args.output_csv)
    if args.html:
        from clients.html_report import render

        with open(args.html, "w") as f:
            f.write(render(summary, results, summary.get("sweep"),
                           title=f"doppelchip load: {summary.get('deployment', '')}",
                           conclusions=report_conclusions(summary)))
    for warning in summary.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
    elif "sweep" in summary:
        print(format_sweep(summary))
    else:
        print(format_summary(summary))
    if "sweep" not in summary and summary.get("errors") and not summary.get("requests"):
        return exit_codes.FAILED  # every request failed: the numbers above measure nothing
    return exit_codes.OK


def format_sweep(s: dict[str, Any]) -> str:
    if "max_concurrency_meeting_slo" in s:
        return _format_concurrency_sweep(s)
    lines = [f"{'offered':>8} {'achieved':>8} {'ratio':>6} {'tok/s':>9} {'TTFT p50':>9} "
             f"{'TTFT p99':>9} {'E2E p50':>9} {'goodput':>8} {'requests':>8} errors"
             "   (rates per emulated second)"]
    for p in s["sweep"]:
        st = p["steady"]
        good = f"{st['goodput_fraction'] * 100:.0f}%" if "slo" in s else "-"
        lines.append(
            f"{p['offered_rate']:8.4g} {st['achieved_rate']:8.1f} "
            f"{st['achieved_over_offered']:6.2f}"
            f" {p['output_tokens_per_s']:9.0f} {_ms(p['ttft_s']['p50'])} {_ms(p['ttft_s']['p99'])}"
            f" {_ms(p['e2e_s']['p50'])} {good:>8} {p['num_requests']:8d} "
            f"{sum(p['errors'].values())}")
    lines.extend(conclusions(s))
    return "\n".join(lines)


def conclusions(s: dict[str, Any]) -> list[str]:
    """The sweep's conclusions in words: the terminal and the HTML report print the same."""
    out = []
    last = s["sweep"][-1]
    if s.get("saturated_at") is not None and "steady" in last:
        st = last["steady"]
        why = (f"achieved {st['achieved_rate']:.1f} req/s, {st['achieved_over_offered']:.0%} "
               f"of offered" + (f", TTFT grew {st['ttft_growth']:.1f}x over the run"
                                if st["ttft_growth"] > 2 else ""))
        out.append(f"saturated at {s['saturated_at']:g} req/s offered ({why})")
    elif s.get("saturated_at") is not None:
        out.append(f"saturated at concurrency {s['saturated_at']:g}")
    else:
        out.append("not saturated by the rates tried")
    if s.get("bottleneck"):
        out.append(f"bottleneck: {s['bottleneck']['kind']} ({s['bottleneck']['why']})")
    if "slo" in s:
        best = s.get("max_rate_meeting_slo")
        at = next((p for p in s["sweep"] if p.get("offered_rate") == best), None)
        terms = ", ".join(f"{k} <= {v * 1e3:g} ms" for k, v in s["slo"].items())
        if at is None:
            out.append(f"no rate tried met the SLO ({terms})")
        else:
            cost = (f", ${at['usd_per_mtok']:.3g} per million output tokens"
                    if at.get("usd_per_mtok") else "")
            out.append(f"highest rate meeting the SLO ({terms}): {best:g} req/s "
                       f"(achieved {at['steady']['achieved_rate']:.1f} req/s{cost})")
    rp = s.get("requests_per_point")
    if rp:
        raised = [p for p in s["sweep"] if p["num_requests"] > rp["minimum"]]
        out.append(f"requests per rate: at least {rp['minimum']} (--num-requests), raised "
                   f"at {len(raised)} of {len(s['sweep'])} rates so that {rp['rule']}")
    return out


def report_conclusions(s: dict[str, Any]) -> list[str]:
    """What the HTML report opens with: a sweep's conclusions, or one run's headline."""
    if "sweep" in s:
        return conclusions(s) if "offered_rate" in s["sweep"][0] else \
            _format_concurrency_sweep(s).splitlines()[len(s["sweep"]) + 1:]
    line = (f"{s['requests']} requests at {s['requests_per_s']:.1f} req/s, "
            f"{s['output_tokens_per_s']:.0f} output tokens/s (emulated); TTFT p50 "
            f"{s['ttft_s']['p50'] * 1e3:.1f} ms, p99 {s['ttft_s']['p99'] * 1e3:.1f} ms")
    out = [line]
    if "goodput" in s:
        out.append(f"{s['goodput']['fraction']:.0%} of requests met the SLO "
                   f"({s['goodput']['requests_per_s']:.1f} req/s goodput)")
    if s.get("usd_per_mtok"):
        out.append(f"${s['usd_per_mtok']:.3g} per million output tokens")
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:7.1f}ms"


def _format_concurrency_sweep(s: dict[str, Any]) -> str:
    lines = [f"{'conc':>8} {'req/s':>8} {'tok/s':>10} {'TTFT p50':>10} {'TTFT p99':>10} "
             f"{'E2E p50':>10} {'goodput':>8} errors   (rates per emulated second)"]
    for p in s["sweep"]:
        good = f"{p['goodput']['fraction'] * 100:.0f}%" if "goodput" in p else "-"
        lines.append(
            f"{p['concurrency']:8.3g} {p['requests_per_s']:8.2f} "
            f"{p['output_tokens_per_s']:10.1f} {p['ttft_s']['p50'] * 1e3:8.1f}ms "
            f"{p['ttft_s']['p99'] * 1e3:8.1f}ms {p['e2e_s']['p50'] * 1e3:8.1f}ms {good:>8} "
            f"{sum(p['errors'].values())}")
    best = s.get("max_concurrency_meeting_slo")
    lines.append(f"saturated at concurrency {s['saturated_at']:g}" if s.get("saturated_at")
                 else "not saturated by the concurrency values tried")
    if s.get("bottleneck"):
        lines.append(f"bottleneck: {s['bottleneck']['kind']} ({s['bottleneck']['why']})")
    if "slo" in s:
        lines.append(f"highest concurrency meeting the SLO: {best:g}" if best is not None
                     else "no concurrency tried met the SLO")
    return "\n".join(lines)
