"""`doppelchip devices` and `doppelchip estimate`: the device catalogue and a single-point estimate.

``register(subparsers)`` adds both subcommands; each handler imports ``devices`` lazily and
returns an exit code (estimate: 2 with ``{"fits": false, "error": ...}`` when the deployment
cannot be placed). ``devices --json`` gives every fitted factor with its ``provenance``
(fitted from which points, borrowed from which group, or an assumption).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any


def register(subparsers: Any) -> None:
    """Add the ``devices`` and ``estimate`` subcommands to an argparse subparsers object."""
    d = subparsers.add_parser(
        "devices", help="list the emulated chips, engines, models, quantisations and "
        "checkpoints",
        description="The device catalogue: chips with memory tiers, bandwidths, FLOPs, power "
        "and price; engines; models; quantisations; the Hugging Face checkpoints `vllm serve` "
        "names. Every chip, model, quantisation and checkpoint names its public source (last "
        "column; details in the comments of devices/catalog/*.toml); engines are software "
        "profiles whose efficiency factors are fitted (their provenance is in --json).",
    )
    d.add_argument("--json", action="store_true",
                   help="print one single-line JSON object instead of tables")
    d.add_argument("--no-sources", action="store_true",
                   help="leave out the tables' source column (narrower output)")
    d.set_defaults(func=cmd_devices)

    e = subparsers.add_parser(
        "estimate", help="estimate one deployment at one point (llama-bench-like)",
        description="Prefill and decode rates, TTFT, TPOT, memory per tier, chips used, "
        "joules and dollars per million output tokens for one deployment and batch.",
    )
    e.add_argument("--chip", required=True, help="chip id (see `doppelchip devices`)")
    e.add_argument("--count", type=int, default=None,
                   help="total chips (GPUs: tp × pp); omit for Groq/Cerebras to compute it")
    e.add_argument("--engine", required=True, help="engine id, e.g. vllm, llama.cpp, groq")
    e.add_argument("--model", required=True, help="model id, e.g. llama-3.1-8b")
    e.add_argument("--quant", required=True, help="weight format id, e.g. bf16, q4_0, fp8")
    e.add_argument("--tp", type=int, default=None,
                   help="tensor-parallel degree (default: count / pp, or 1 with --ep)")
    e.add_argument("--pp", type=int, default=None, help="pipeline-parallel degree (default 1)")
    e.add_argument("--ep", type=int, default=None,
                   help="expert-parallel degree for MoE models: experts over ep of the "
                   "tp × dp chips of a stage (count = tp × pp × dp; --count 8 --ep 8 = "
                   "8 attention replicas, experts over all 8)")
    e.add_argument("--data-parallel-size", "-dp", type=int, default=1, metavar="N",
                   help="one of N data-parallel engine cores (vLLM's: a MoE model's ranks "
                   "share its experts); the figures are that rank's (default 1)")
    e.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "bf16", "f16"],
                   help="KV cache element type (auto: the quantisation's)")
    e.add_argument("--speculative-config", default=None, metavar="JSON",
                   help="vLLM's speculative_config JSON plus acceptance_rate, e.g. "
                   '\'{"method": "eagle3", "num_speculative_tokens": 3, '
                   '"acceptance_rate": 0.7}\' (or SGLang\'s simulated acceptance_length, '
                   "acceptance_method, and an EAGLE tree's eagle_topk, num_draft_tokens: "
                   "devices/speculative.py)")
    e.add_argument("--convert", default=None, choices=("auto", "none", "embed", "classify"),
                   help="vLLM's --convert: a generative checkpoint priced as an embedding "
                   "model or a classifier (without its LM head; docs/EMBEDDINGS.md)")
    e.add_argument("--hf-overrides", default=None, metavar="JSON",
                   help="vLLM's config.json overrides: a classifier's architectures, "
                   "classifier_from_token and method (docs/EMBEDDINGS.md)")
    e.add_argument("--n-gpu-layers", type=int, default=None,
                   help="llama.cpp: layers kept in VRAM (default: as many as fit)")
    e.add_argument("--built-for", default=None,
                   help="TensorRT-LLM: GPU architecture the engine was built for (e.g. hopper)")
    e.add_argument("--max-context", type=int, default=None,
                   help="context length to provision (default: model's, capped by KV)")
    e.add_argument("--prompt", type=int, default=512, help="prompt tokens per sequence")
    e.add_argument("--output", type=int, default=128, help="output tokens per sequence")
    e.add_argument("--batch", type=int, default=1, help="sequences processed together")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(func=cmd_estimate)


def _capacity(tier: dict[str, Any]) -> str:
    """The vendor's figure, and beside it the total the device reports where that differs
    (what placement uses: ``devices.specs.Tier``)."""
    nominal = _si(tier["nominal_bytes"], "B")
    if tier["nominal_bytes"] == tier["capacity_bytes"]:
        return nominal
    return f"{nominal} ({tier['capacity_bytes'] / 2**20:,.0f} MiB)"


def _catalogue() -> dict[str, Any]:
    from devices import catalog, fitted_factors

    chips = []
    for c in catalog.list_chips(None):
        chips.append({
            "id": c.id, "name": c.name, "kind": c.kind, "class": c.chip_class, "arch": c.arch,
            "placement": c.placement, "domain_size": c.domain_size,
            "tiers": [{"name": t.name, "capacity_bytes": t.capacity_bytes,
                       "nominal_bytes": t.nominal, "bandwidth_bytes_per_s": t.bandwidth_bps}
                      for t in c.tiers],
            "peak_flops": dict(c.peak_flops), "link_bytes_per_s": c.link_bw_bps,
            "busy_watts": c.busy_watts, "idle_watts": c.idle_watts,
            "usd_per_hour": round(c.usd_per_hour, 4), "price_basis": c.price_basis,
            "source": dict(c.sources).get("catalogue", ""),
        })
    factors = fitted_factors()
    engines = [{
        "id": e.id, "name": e.name, "chip_classes": list(e.chip_classes),
        "kv_layout": e.kv_layout, "batching": e.batching, "prefix_cache": e.prefix_cache,
        "compile": e.compile, "jump_forward": e.jump_forward, "launch": e.launch,
        "scheduler": {"policy": e.scheduler.policy, "max_num_seqs": e.scheduler.max_num_seqs,
                      "max_num_batched_tokens": e.scheduler.max_num_batched_tokens,
                      "by_memory": [{"min_memory_bytes": t.min_bytes,
                                     "max_num_seqs": t.max_num_seqs,
                                     "max_num_batched_tokens": t.max_num_batched_tokens,
                                     "except_names": list(t.except_names)}
                                    for t in e.scheduler.by_memory],
                      "kv_seqs": (dataclasses.asdict(e.scheduler.kv_seqs)
                                  if e.scheduler.kv_seqs else None)},
        "memory": dataclasses.asdict(e.memory) if e.memory else None,
        "expert_parallel": e.expert_parallel, "speculative_methods": list(e.speculative_methods),
        "factors": {cls: {"bw_eff": round(f.bw_eff, 4), "flop_eff": round(f.flop_eff, 4),
                          "kernel_s": f.kernel_s, "origin": f.origin,
                          "provenance": {n: p.as_dict() for n, p in f.provenance}}
                    for (eid, cls), f in sorted(factors.items()) if eid == e.id},
    } for e in catalog.list_engines()]
    models = [{
        "id": m.id, "name": m.name, "params": m.params, "active_params": m.active_params,
        "layers": m.n_layers, "hidden": m.hidden, "heads": m.n_heads, "kv_heads": m.n_kv_heads,
        "experts": m.n_experts, "active_experts": m.n_active_experts,
        "attention": "mla" if m.is_mla else "gqa", "sliding_window": m.sliding_window,
        "sliding_layers": m.sliding_layers, "kv_bytes_per_token_bf16": m.kv_bytes_per_token(2),
        "max_context": m.max_context, "source": m.source,
    } for m in catalog.list_models()]
    quants = [{"id": q.id, "bytes_per_weight": q.bytes_per_weight, "kv_bytes": q.kv_bytes,
               "compute_dtype": q.compute_dtype, "family": q.family,
               "vllm_quantization": list(q.vllm_quantization), "source": q.source}
              for q in catalog.list_quants()]
    checkpoints = [{"repo": c.repo, "model": c.model, "quant": c.quant, "source": c.source}
                   for c in catalog.list_checkpoints()]  # what `vllm serve REPO` names
    return {"chips": chips, "engines": engines, "models": models, "quants": quants,
            "checkpoints": checkpoints}


def _si(x: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.4g} {prefix}{unit}"
    return f"{x:.4g} {unit}"


def _memory_rule(memory: dict[str, Any] | None) -> str:
    """How an engine sizes its KV pool: its rule and default share ('auto': computed)."""
    if memory is None:
        return "-"
    share = "auto" if memory["fraction"] is None else f"{memory['fraction']:g}"
    return f"{memory['rule']} {share}"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cmd_devices(args: argparse.Namespace) -> int:
    cat = _catalogue()
    if args.json:
        print(json.dumps(cat))  # one line: the last line of a --json command is its object
        return 0

    def sourced(rows: list[list[str]], entries: list[dict[str, Any]]) -> list[list[str]]:
        """The rows with a last column naming each entry's public source."""
        if args.no_sources:
            return rows
        return [[*rows[0], "source"]] + [[*r, e.get("source") or "-"]
                                         for r, e in zip(rows[1:], entries, strict=True)]

    rows = [["chip", "class", "memory tiers", "peak FLOP/s", "busy/idle W", "$/h"]]
    for c in cat["chips"]:
        tiers = ", ".join(f"{t['name']} {_capacity(t)} @ {_si(t['bandwidth_bytes_per_s'], 'B/s')}"
                          for t in c["tiers"])
        peaks = " ".join(f"{k} {_si(v, '')}" for k, v in c["peak_flops"].items())
        rows.append([c["id"], c["class"], tiers, peaks,
                     f"{c['busy_watts']:g}/{c['idle_watts']:g}", f"{c['usd_per_hour']:.3f}"])
    print(table(sourced(rows, cat["chips"])))
    print()
    rows = [["engine", "chip classes", "kv", "batching", "prefix", "compile", "memory"]]
    for e in cat["engines"]:
        rows.append([e["id"], ",".join(e["chip_classes"]), e["kv_layout"], e["batching"],
                     e["prefix_cache"], e["compile"], _memory_rule(e["memory"])])
    print(table(rows))
    print()
    rows = [["model", "params", "layers", "hidden", "heads/kv", "experts", "context"]]
    for m in cat["models"]:
        experts = f"{m['active_experts']}/{m['experts']}" if m["experts"] else "-"
        rows.append([m["id"], _si(m["params"], ""), str(m["layers"]), str(m["hidden"]),
                     f"{m['heads']}/{m['kv_heads']}", experts, str(m["max_context"])])
    print(table(sourced(rows, cat["models"])))
    print()
    rows = [["quant", "bytes/weight", "kv bytes"]]
    rows += [[q["id"], f"{q['bytes_per_weight']:g}", f"{q['kv_bytes']:g}"] for q in cat["quants"]]
    print(table(sourced(rows, cat["quants"])))
    print()
    rows = [["checkpoint (vllm serve REPO)", "model", "quant"]]
    rows += [[c["repo"], c["model"], c["quant"]] for c in cat["checkpoints"]]
    print(table(sourced(rows, cat["checkpoints"])))
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from devices import DeploymentSpec, SpeculativeConfig, SpeculativeConfigError, catalog, estimate
    from devices.errors import UnknownId
    from server.engine.hf_overrides import Conversion, conversion

    result: dict[str, Any] = {}
    try:
        speculative = SpeculativeConfig.parse(args.speculative_config)
    except SpeculativeConfigError as e:
        speculative, result = None, {"fits": False, "error": str(e)}
    served = Conversion()
    try:
        model = catalog.get_model(args.model)
        served = conversion(args.hf_overrides, None, args.convert, model.name, model.pooling_task)
    except UnknownId:
        pass  # (estimate says so)
    except ValueError as e:
        result = result or {"fits": False, "error": str(e)}
    spec = DeploymentSpec(
        model=args.model, quant=args.quant, chip=args.chip, engine=args.engine,
        count=args.count, tp=args.tp, pp=args.pp, ep=args.ep, n_gpu_layers=args.n_gpu_layers,
        built_for=args.built_for, max_context=args.max_context,
        kv_cache_dtype=args.kv_cache_dtype, speculative=speculative,
        convert=served.task, num_labels=served.num_labels,
    )
    if not result and min(args.prompt, args.output - 1, args.batch - 1) < 0:
        result = {"fits": False, "error": "--prompt must be >= 0, --output and --batch >= 1"}
    if not result and args.data_parallel_size < 1:
        result = {"fits": False, "error": "--data-parallel-size must be >= 1, got "
                  f"{args.data_parallel_size}"}
    if not result and args.max_context is not None and args.max_context < 1:
        result = {"fits": False, "error": f"--max-context must be >= 1, got {args.max_context}"}
    usage = bool(result)  # a flag's value, not the placement, is what is wrong
    if not result:
        result = estimate(spec, args.prompt, args.output, args.batch,
                          ranks=args.data_parallel_size)
    if args.json:
        print(json.dumps(result))
    elif not result["fits"]:
        print(f"{'error' if usage else 'does not fit'}: {result['error']}", file=sys.stderr)
    else:
        print(format_estimate(result))
    return 0 if result["fits"] else 2


def format_estimate(result: dict[str, Any]) -> str:
    """One line per figure, with its unit."""
    units = result.get("units", {})
    lines = []
    for key, value in result.items():
        if key == "units":
            continue
        if key == "memory_bytes":
            value = ", ".join(f"{t} {_si(b, 'B')}" for t, b in value.items())
        elif key in units and isinstance(value, (int, float)):
            value = f"{value:g} {units[key]}"
        lines.append(f"{key:24} {value}")
    return "\n".join(lines)
