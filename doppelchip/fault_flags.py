"""The failure-injection flags (issue 13; docs/FAULTS.md) that `add_deployment_args`
(sim_flags.py) adds to every command taking a deployment: llm-d-inference-sim's request-level
flags and doppelchip's device faults.

Why apart: one group of flags with its own document, kept out of `sim_flags.py` so that file
stays the deployment and workload flags.
"""

from __future__ import annotations

import argparse


def add_fault_args(p: argparse.ArgumentParser) -> None:
    """Failure injection (issue 13; docs/FAULTS.md): llm-d-inference-sim's request-level flags
    and doppelchip's device faults. Each SPEC is key=value pairs, e.g. "at=30,for=10,factor=3";
    times are emulated seconds since the server started."""
    g = p.add_argument_group("failure injection (docs/FAULTS.md)")
    g.add_argument("--failure-injection-rate", type=float, metavar="PERCENT",
                   help="percent (0-100) of generation requests refused with an injected "
                   "error, as llm-d-inference-sim")
    g.add_argument("--failure-types", nargs="+", metavar="TYPE",
                   help="the injected errors: rate_limit invalid_api_key context_length "
                   "server_error invalid_request model_not_found (default: all)")
    g.add_argument("--failure-injection-seed", type=int, metavar="N",
                   help="seed of every fault draw (default: the deployment's seed)")
    g.add_argument("--fault-slowdown", nargs="+", metavar="SPEC",
                   help="steps cost FACTOR times more: at=T,for=D,factor=F or rate=R,for=D,"
                   "factor=F (R: events per emulated second)")
    g.add_argument("--fault-hang", nargs="+", metavar="SPEC",
                   help="no step for D seconds (health stays SERVING): at=T,for=D or "
                   "rate=R,for=D")
    g.add_argument("--fault-crash", nargs="+", metavar="SPEC",
                   help="the engine process dies (restarted after the back-off and its cold "
                   "start): at=T or rate=R")
    g.add_argument("--fault-lost-chips", nargs="+", metavar="SPEC",
                   help="K chips' share of the KV pool is lost (preemptions follow): "
                   "at=T,chips=K[,for=D] or rate=R,chips=K,for=D")
    g.add_argument("--fault-stream-cut", nargs="+", metavar="SPEC",
                   help="streams cut after K tokens (gRPC UNAVAILABLE, HTTP closed without "
                   "[DONE]): after=K,at=T,for=D or after=K,percent=P")
