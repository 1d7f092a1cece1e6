"""`doppelchip whatif`: one workload across the chip families, and the design notes' plots."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "whatif", help="compare chip families on one workload in virtual time",
        description="Simulate one workload on one deployment per chip family (H100 with vLLM "
        "and TensorRT-LLM, TPU v5e-8, M4 Max, Groq, Cerebras) across batch sizes, plus long "
        "prompts on Apple silicon, llama.cpp tiers and Groq compile stalls; print the "
        "computed crossovers and write plots.",
    )
    p.add_argument("--model", default="llama-3.1-8b", help="model id (default llama-3.1-8b)")
    p.add_argument("--isl", type=int, default=512, help="input tokens per request")
    p.add_argument("--osl", type=int, default=256, help="output tokens per request")
    p.add_argument("--batches", default="1,4,16,64,256",
                   help="closed-loop batch sizes to sweep (comma-separated)")
    p.add_argument("--count", type=int, default=None,
                   help="HBM GPU/TPU families: chips (default: the smallest power of two the "
                   "model fits on; SRAM families are always sized for each batch)")
    p.add_argument("--tp", type=int, default=None, help="HBM families: tensor-parallel degree")
    p.add_argument("--pp", type=int, default=None, help="HBM families: pipeline-parallel degree")
    p.add_argument("--ep", type=int, default=None,
                   help="HBM families: expert-parallel degree (MoE models)")
    p.add_argument("--out", metavar="DIR",
                   help="write whatif.json and whatif.html (plots) into DIR")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.set_defaults(func=cmd_whatif)


def cmd_whatif(args: argparse.Namespace) -> int:
    from devices import DeviceError, catalog
    from doppelchip.outpaths import unwritable
    from sim.whatif import WhatIfConfig, run_whatif

    problem = check_args(args)
    if not problem:
        try:
            model = catalog.get_model(args.model)
        except DeviceError as e:  # UnknownId: the message lists the known ids
            problem = f"--model: {e}"
        else:
            if model.is_pooling:
                problem = (f"--model: {args.model} is a pooling model ({model.pooling_task}): "
                           "it generates no token, and what-if compares generation (cost per "
                           "output token against each user's speed); `doppelchip simulate` "
                           "and `doppelchip plan` price it per million input tokens")
            elif args.isl + args.osl > model.max_context:
                problem = (f"--isl + --osl is {args.isl + args.osl} tokens; {args.model}'s "
                           f"context is {model.max_context}")
    problem = problem or unwritable([], [("--out", args.out)])
    if problem:
        print(json.dumps({"error": problem}) if args.json else f"error: {problem}",
              file=sys.stderr)
        return 2
    result = run_whatif(WhatIfConfig(model=args.model, isl=args.isl, osl=args.osl,
                                     batches=_batches(args.batches), count=args.count,
                                     tp=args.tp, pp=args.pp, ep=args.ep,
                                     # the context the workload needs (SRAM chips hold it)
                                     max_model_len=max(WhatIfConfig.max_model_len,
                                                       args.isl + args.osl)))
    if args.out:
        from clients.whatif_report import render

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "whatif.json").write_text(json.dumps(result, indent=1))
        (out / "whatif.html").write_text(render(result, describe(result).splitlines()))
    print(json.dumps(result) if args.json else describe(result))
    return 0


MAX_BATCH = 4096  # a bound on the run: a point of batch B simulates B requests to the end


def _batches(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(b) for b in text.split(",") if b.strip())
    except ValueError:
        return ()


def check_args(args: argparse.Namespace) -> str:
    """What is wrong with whatif's numeric flags ("" when nothing)."""
    batches = _batches(args.batches)
    if not batches or min(batches) < 1:
        return f"--batches needs integers >= 1, got {args.batches!r}"
    if max(batches) > MAX_BATCH:  # a simulated request per sequence: 1024 take ~40 s here
        return (f"--batches: at most {MAX_BATCH} sequences (each one simulated), "
                f"got {max(batches)}")
    for flag in ("isl", "osl", "count", "tp", "pp", "ep"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            return f"--{flag} must be >= 1, got {value}"
    return ""


def describe(r: dict[str, Any]) -> str:
    lines = [f"cost vs speed ({r['model']}, {r['isl']} in / {r['osl']} out):"]
    for name, pts in r["cost_vs_speed"]["curves"].items():
        cells = "  ".join(f"b{p['batch']}: {p['per_user_tokens_per_s']:.0f} tok/s "
                          f"${p['usd_per_mtok']:.3g} ({p['chips']} chips)" for p in pts)
        lines.append(f"  {name:<18} {cells}")
    for name, why in r["cost_vs_speed"]["failed"].items():
        lines.append(f"  {name:<18} cannot be placed: {why}")
    lines.append("  cheapest deployment by per-user speed:")
    for step in r["cost_vs_speed"]["frontier"]:
        lines.append(f"    >= {step['from_per_user_tokens_per_s']:7.0f} tok/s per user: "
                     f"{step['deployment']} ({step['memory']}, ${step['usd_per_mtok']:.3g}/Mtok)")
    ttft = r["long_prompt_ttft"]
    lines.append(f"long prompts on {ttft['chip']} (TTFT s):")
    for engine, rows in ttft["series"].items():
        lines.append(f"  {engine:<10} " + "  ".join(f"{x['prompt_tokens']}: {x['ttft_s']:.3f}"
                                                   for x in rows))
    for engine, why in ttft.get("failed", {}).items():
        lines.append(f"  {engine:<10} cannot run: {why}")
    lines.append("llama.cpp on an RTX 4090 box (batch-1 decode tok/s):")
    for row in r["llamacpp_tiers"]:
        value = f"{row['decode_tokens_per_s']:.2f}" if "decode_tokens_per_s" in row else \
            f"cannot run: {row['error']}"
        lines.append(f"  {row['model']:<14} {row['quant']:<7} {value}")
    lines.append("Groq compile stalls:")
    for row in r["groq_shapes"]:
        lines.append(f"  {row['policy']:<10} {row['traffic']:<8} {row['compiles']:3d} compiles, "
                     f"{row['compile_stall_s']:.0f} s stalled, E2E p90 {row['e2e_p90_s']:.2f} s")
    return "\n".join(lines)
