"""`doppelchip simulate`: a workload through one deployment in virtual time, and its report.

The front door joins the layers: the workload comes from `clients.workloads`, the engine
core from `server.engine.build`, `run_virtual` from `sim.virtual`, and the records
go back to `clients.report` — the same summary the load generator prints for a gRPC server.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any


def add_deployment_args(p: argparse.ArgumentParser, verb: str = "simulate",
                        with_config: bool = True) -> None:
    """The deployment flags shared by simulate, serve's pod mode (and the load generator's
    sim: target)."""
    g = p.add_argument_group("deployment (a fleet file's deployment, or flags as in estimate)")
    if with_config:
        g.add_argument("--config", metavar="FILE",
                       help="fleet TOML file to take a deployment from")
    g.add_argument("--deployment", metavar="NAME",
                   help=f"deployment of --config (or of the built-in fleet) to {verb}")
    g.add_argument("--chip", help="chip id, e.g. h100-sxm (see `doppelchip devices`)")
    g.add_argument("--engine", help="engine id, e.g. vllm, sglang, llama.cpp, groq")
    g.add_argument("--model", help="model id, e.g. llama-3.1-8b")
    g.add_argument("--quant", help="weight format id, e.g. bf16, fp8, q4_k_m")
    g.add_argument("--count", type=int, help="total chips (default: tp × pp, or computed)")
    g.add_argument("--tp", type=int, help="tensor-parallel degree")
    g.add_argument("--pp", type=int, help="pipeline-parallel degree")
    g.add_argument("--ep", type=int,
                   help="expert-parallel degree (MoE): experts over ep of a stage's tp × dp "
                   "chips; without --tp, attention runs data parallel (count = tp × pp × dp)")
    g.add_argument("--kv-cache-dtype", choices=["auto", "fp8"],
                   help="KV cache element type (auto: the quantisation's)")
    g.add_argument("--speculative-config", metavar="JSON",
                   help="vLLM's speculative_config JSON plus acceptance_rate, e.g. "
                   '\'{"method": "eagle3", "num_speculative_tokens": 3, '
                   '"acceptance_rate": 0.7}\'')
    g.add_argument("--n-gpu-layers", type=int, help="llama.cpp: layers on the GPU")
    g.add_argument("--built-for", help="TensorRT-LLM: GPU architecture the engine was built for")
    g.add_argument("--max-model-len", type=int, help="context length (default: model's, capped)")
    g.add_argument("--max-num-seqs", type=int, help="sequence cap per step (engine default)")
    g.add_argument("--max-num-batched-tokens", type=int, help="token budget per step")
    g.add_argument("--policy", choices=["fcfs", "priority", "lpm"], help="queue policy")
    g.add_argument("--prefix-cache", choices=["on", "off"], help="radix prefix cache on/off")
    g.add_argument("--kv-layout", choices=["paged", "contiguous"],
                   help="paged blocks, or the pre-vLLM contiguous max-length reservation")
    g.add_argument("--batching", choices=["continuous", "static"], help="batching baseline")
    g.add_argument("--output-len-mean", type=float,
                   help="mean output length when EOS is sampled (default 128)")
    g.add_argument("--cold", action="store_true", help="start cold: pay the build/compile time")
    g.add_argument("--jump-forward", choices=["on", "off"],
                   help="structured output: append grammar-forced tokens without decoding "
                   "them (default: the engine's; on for sglang)")
    # ---- request limits (issue 14; docs/OPERATIONS.md) -------------------------------------
    g.add_argument("--max-prompt-bytes", type=int, metavar="BYTES",
                   help="largest prompt text, checked before tokenizing (default 2000000)")
    g.add_argument("--max-stop-strings", type=int, metavar="N",
                   help="stop strings per request (default 256)")
    g.add_argument("--max-stop-bytes", type=int, metavar="BYTES",
                   help="longest stop string (default 1024)")
    g.add_argument("--max-grammar-bytes", type=int, metavar="BYTES",
                   help="largest constraint: regex, JSON schema or grammar (default 65536)")
    g.add_argument("--max-grammar-depth", type=int, metavar="N",
                   help="deepest nesting a constraint may have (default 100)")
    # ---- end request limits ----------------------------------------------------------------
    # --- KV events (issue 13) ---
    g.add_argument("--kv-events-config", metavar="JSON",
                   help="vLLM's KV-cache events config, e.g. "
                   '\'{"enable_kv_cache_events": true, "publisher": "zmq", '
                   '"replay_endpoint": "tcp://*:5558"}\' (ZeroMQ on 127.0.0.1:5557 by '
                   "default; docs/KV_EVENTS.md)")
    g.add_argument("--prefix-caching-hash-algo", choices=["sha256", "sha256_cbor"],
                   help="vLLM's block hash of the prefix cache and its KV events "
                   "(default sha256)")
    # --- LoRA (issue 13): vLLM's flags (docs/LORA.md) ---
    g.add_argument("--enable-lora", action="store_true", default=None,
                   help="serve LoRA adapters (selected by a request's model name)")
    g.add_argument("--max-loras", type=int, help="LoRA adapters one batch may run (default 1)")
    g.add_argument("--max-lora-rank", type=int,
                   help="largest adapter rank (default 16; 1, 8, 16, 32, 64, 128, 256, 320, 512)")
    g.add_argument("--max-cpu-loras", type=int,
                   help="adapters kept in host memory, LRU (default: --max-loras)")
    g.add_argument("--lora-modules", nargs="+", metavar="NAME=PATH|JSON",
                   help='adapters at start-up: name=path or \'{"name": ..., "path": ..., '
                   '"base_model_name": ..., "rank": ...}\' (the path is recorded, not read)')
    # --- P/D and sleep mode (issue 13) ---
    g.add_argument("--kv-transfer-config", metavar="JSON",
                   help="vLLM's KV transfer config for disaggregated prefill/decode, e.g. "
                   '\'{"kv_connector":"NixlConnector","kv_role":"kv_both"}\' '
                   '(kv_connector_extra_config.link: a link id; docs/PD.md)')
    g.add_argument("--enable-sleep-mode", action="store_true",
                   help="accepted for vLLM compatibility: sleep mode is always available")
    add_fault_args(p)


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


# `simulate`'s arrivals when --rate is not given: a Poisson stream at this rate (issue 15; all
# at once hides what static batching and contiguous KV cost a newcomer's first run)
SIMULATE_DEFAULT_RATE = 10.0


class _GivenRate(argparse.Action):
    """--rate that also records it was given (`rate_given`): --rate-shape refuses an explicit
    rate, not the default one."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.rate_given = True


def add_workload_args(p: argparse.ArgumentParser, default_rate: float = math.inf) -> None:
    """The workload flags of simulate and load; `default_rate` is --rate's default (inf: every
    request at t=0, load's default; simulate passes SIMULATE_DEFAULT_RATE)."""
    g = p.add_argument_group("workload")
    g.add_argument("--workload", default="random",
                   choices=["random", "shared-prefix", "multi-turn", "structured", "mix",
                            "trace"],
                   help="workload kind (structured: JSON-schema output with long fixed keys; "
                   "mix: --mix weights; trace: replay --trace FILE)")
    g.add_argument("--mix", default="random=1", metavar="KIND=W,...",
                   help="mix: weights of the workloads to interleave, e.g. "
                   "random=0.6,shared-prefix=0.3,structured=0.1")
    g.add_argument("--trace", metavar="FILE",
                   help="JSONL trace to replay: timestamp, prompt_token_ids | prompt | "
                   "input_length, max_tokens per line (see clients/trace.py)")
    g.add_argument("--isl", type=int, default=128, help="input (user message) tokens")
    g.add_argument("--osl", type=int, default=128, help="output tokens (max_tokens)")
    g.add_argument("--num-requests", type=int, default=None,
                   help="requests (conversations for multi-turn); default 100")
    g.add_argument("--duration", type=float, default=None,
                   help="seconds of arrivals at --rate (instead of --num-requests)")
    rate_help = ("arrivals per second (inf: all at once; the default)" if math.isinf(default_rate)
                 else f"arrivals per second, --arrival poisson by default (default "
                 f"{default_rate:g}; inf: all at once)")
    g.add_argument("--rate", type=float, default=default_rate, help=rate_help, action=_GivenRate)
    g.add_argument("--arrival", default="poisson", choices=["poisson", "constant", "gamma"],
                   help="arrival process for a finite --rate")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma arrivals: shape of the gaps (< 1 burstier than Poisson)")
    g.add_argument("--ramp-up", type=float, default=0.0, metavar="SECONDS",
                   help="the rate grows linearly from 0 to --rate over this many seconds")
    g.add_argument("--length-dist", default="fixed",
                   choices=["fixed", "uniform", "normal", "histogram"],
                   help="input/output lengths around --isl/--osl (default fixed), or drawn "
                   "from --length-file")
    g.add_argument("--length-file", metavar="FILE",
                   help="histogram of lengths: CSV rows input,output,weight")
    g.add_argument("--length-spread", type=float, default=0.0,
                   help="uniform: ± this fraction of the mean; normal: std as this fraction")
    g.add_argument("--seed", type=int, default=0, help="workload seed")
    g.add_argument("--ignore-eos", action="store_true",
                   help="generate exactly --osl tokens (otherwise EOS is sampled)")
    g.add_argument("--system-prompt-len", type=int, default=1024,
                   help="shared-prefix: tokens of each shared system prompt")
    g.add_argument("--num-prefixes", type=int, default=4, help="shared-prefix: groups")
    g.add_argument("--users-per-prefix", type=int, default=0,
                   help="shared-prefix: users per group (0: spread evenly)")
    g.add_argument("--turns", type=int, default=3, help="multi-turn: turns per conversation")
    g.add_argument("--think-time", type=float, default=0.0,
                   help="multi-turn: seconds between a reply and the next user turn")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate", help="run a workload through one deployment in virtual time",
        description="Simulate a workload in virtual time (no sleeping: hours of traffic in "
        "seconds) with the server's own scheduler, KV cache and device model, and report "
        "throughput, latency percentiles, cache hits, preemptions, compile stalls, energy "
        f"and cost. Requests arrive as a Poisson stream at --rate (default "
        f"{SIMULATE_DEFAULT_RATE:g} per second); --rate inf sends them all at once.",
    )
    add_deployment_args(p)
    add_workload_args(p, default_rate=SIMULATE_DEFAULT_RATE)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    # --- virtual-time clusters (issue 16): sim/fleet_simulation.py, docs/LOAD.md ---
    p.add_argument("--router", choices=ROUTERS,
                   help="simulate every deployment of --config (each `replicas` copies) as "
                   "one pool behind this router (default with replicas > 1: round-robin)")
    # --- end virtual-time clusters ---
    add_fleet_args(p)
    add_autoscale_args(p)  # --- autoscale (issue 16) ---
    # --- capacity planning (issue 16): what `doppelchip plan` checks (docs/PLAN.md) ---
    g = p.add_argument_group("SLO (as load --slo)")
    g.add_argument("--slo", metavar="ttft=S,tpot=S,e2e=S",
                   help="per-request latency bounds in seconds; the summary adds the share "
                   "of requests meeting every one (goodput)")
    # --- end capacity planning ---
    # --- speed (issue 16): server/engine/macro.py ---
    g = p.add_argument_group("virtual-time speed")
    g.add_argument("--no-macro-steps", dest="macro_steps", action="store_false",
                   help="advance every engine step on its own instead of windows of decode "
                   "steps at once (the same results, slower: a check on macro-stepping)")
    # --- end speed ---
    p.set_defaults(func=cmd_simulate)


# sim.routers.ROUTERS' names and sim.pools.SLO_ROUTER, listed here so that the command line
# imports no layer
ROUTERS = ("round-robin", "least-requests", "least-kv", "prefix-aware", "p2c", "slo-class")


def add_fleet_args(p: argparse.ArgumentParser) -> None:
    """--- fleet (issue 16): SLO classes and admission at the router (docs/PLANNING.md) ---"""
    g = p.add_argument_group("fleet: SLO classes, admission, P/D pools (docs/PLANNING.md)")
    g.add_argument("--slo-class-mix", metavar="CLASS=W,...",
                   help="tag the workload's requests with SLO classes drawn by weight (seeded "
                   "by --seed), e.g. interactive=0.3,batch=0.7; a trace's own slo_class is "
                   "kept. --router slo-class sends each class to the pools listing it "
                   "(fleet-file slo_classes)")
    g.add_argument("--admission", metavar="RULE,...",
                   help="admission at the router, as the Gateway API inference extension's "
                   "saturation detectors: max-outstanding=N (per replica) and/or "
                   "queue-depth=Q,kv-util=U; refused requests end RESOURCE_EXHAUSTED; "
                   "critical=CLASS+CLASS: those SLO classes are never shed (GIE's priority "
                   ">= 0), queued on a replica instead")


# --- autoscale (issue 16): sim/autoscale.py, clients/arrivals.py, docs/AUTOSCALING.md ---
def add_autoscale_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("autoscaling and traffic over time (docs/AUTOSCALING.md)")
    g.add_argument("--autoscale", metavar="SPEC",
                   help="HPA-style autoscaler for every deployment of the pool, e.g. "
                   "metric=waiting,target=4,min=1,max=8 (metric: waiting | kv | running; "
                   "also tolerance, sync_period_s, scale_down_window_s, scale_up_window_s, "
                   "boot_s, provision_s); a deployment's [autoscaling] table does the same")
    g.add_argument("--timeline", type=float, metavar="SECONDS",
                   help="report the fleet over time every SECONDS (default with an "
                   "autoscaler: its sync period)")
    g.add_argument("--rate-shape", metavar="SHAPE",
                   help="time-varying arrivals (non-homogeneous Poisson) instead of --rate: "
                   "ramp:from=1,to=20,over=600 | diurnal:period=3600,min=2,max=20 | "
                   "burst:low=1,high=20,on=10,off=50 | piecewise:0=1,300=20,600=1 "
                   "(with --duration and/or --num-requests)")
    g.add_argument("--trace-format", default="auto",
                   choices=["auto", "jsonl", "azure", "burstgpt", "mooncake"],
                   help="format of --trace (default: sniffed from the file)")
    g.add_argument("--html", metavar="FILE",
                   help="write an HTML report: replicas, queue, latency and dollars over time")
# --- end autoscale ---



def cmd_simulate(args: argparse.Namespace) -> int:
    from sim.fleet_simulation import simulate_fleet, wants_cluster
    from sim.simulation import SimulationError, simulate

    if not getattr(args, "macro_steps", True):  # --- speed (issue 16) ---
        from sim.virtual import MACRO_STEPS
        MACRO_STEPS["default"] = False
    try:  # --- virtual-time clusters (issue 16) ---
        summary = simulate_fleet(args) if wants_cluster(args) else simulate(args)
    except SimulationError as e:
        print(json.dumps({"error": str(e)}) if args.json else f"error: {e}", file=sys.stderr)
        return 2
    if getattr(args, "html", None):  # --- autoscale (issue 16): the report over time ---
        from clients.timeline_report import render_timeline

        with open(args.html, "w") as f:
            f.write(render_timeline(summary))
    if args.json:
        print(json.dumps(summary))
    else:
        from doppelchip.simulate_format import format_fleet, format_summary

        print(format_summary(summary))
        for r in summary.get("replicas", ()):  # --- virtual-time clusters (issue 16) ---
            print(f"replica         {r['name']:<24} {r['requests']:6d} requests, prefix cache "
                  f"{r['prefix_cache_hit_rate'] * 100:5.1f}% hit ({r['chip']})")
        fleet_tables = format_fleet(summary)  # --- fleet (issue 16) ---
        if fleet_tables:
            print(fleet_tables)
        if summary.get("timeline"):  # --- autoscale (issue 16) ---
            from clients.timeline_text import format_scaling, format_timeline

            scaling = format_scaling(summary)
            if scaling:
                print(scaling)
            print(format_timeline(summary["timeline"]))
    return 0
