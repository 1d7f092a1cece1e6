"""`doppelchip load`: one workload against a gRPC server (real time) or `sim:` (virtual time),
and the same report for both."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from doppelchip.cmd_simulate import add_workload_args, format_summary


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
    add_workload_args(p)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--output-json", metavar="FILE",
                   help="write the summary and every request's record as JSON")
    p.add_argument("--output-csv", metavar="FILE", help="write every request's record as CSV")
    p.set_defaults(func=cmd_load)


def cmd_load(args: argparse.Namespace) -> int:
    from doppelchip.loadrun import LoadError, run_load_command

    try:
        summary, results = run_load_command(args)
    except LoadError as e:
        print(json.dumps({"error": str(e)}) if args.json else f"error: {e}", file=sys.stderr)
        return 2
    if args.output_json or args.output_csv:
        from doppelchip.loadrun import write_outputs

        write_outputs(summary, results, args.output_json, args.output_csv)
    for warning in summary.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0
