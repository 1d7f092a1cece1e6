"""The `simulate` command line (`doppelchip simulate`, `load --target sim:`, `plan`) as one
deployment's `EngineOptions`, a `WorkloadSpec` and an SLO, each flag checked by name.

Why a module of its own: sim/simulation.py runs a deployment in virtual time from options and
a workload, whoever built them (the command line here, a fleet file, `plan`'s search); turning
flags into those is apart from running them.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

from clients.report import SummaryStream, parse_slo
from clients.workloads import WorkloadSpec
from server.config import ConfigError, load_fleet, range_problem
from server.engine.faults import check_options as check_fault_options
from server.engine.options import EngineOptions
from sim.simulation import FAULT_KEYS, SimulationError, simulate_streamed

REQUEST_LIMITS = ("max_prompt_bytes", "max_stop_strings", "max_stop_bytes", "max_grammar_bytes",
                  "max_grammar_depth")


def options_from_args(args: argparse.Namespace) -> EngineOptions:
    if args.chip or args.model or args.engine or args.quant:
        missing = [f for f in ("chip", "engine", "model", "quant") if not getattr(args, f)]
        if missing:
            raise SimulationError(f"missing --{', --'.join(missing)}")
        base = EngineOptions(name=f"{args.model}@{args.chip}/{args.engine}", model=args.model,
                             quant=args.quant, chip=args.chip, engine=args.engine)
    else:
        try:
            fleet = load_fleet(args.config)
        except ConfigError as e:
            raise SimulationError(str(e)) from e
        name = args.deployment or fleet.default_deployment
        found = [d for d in fleet.deployments if d.name == name]
        if not found:
            known = ", ".join(d.name for d in fleet.deployments)
            raise SimulationError(f"unknown deployment {name!r} (known: {known})")
        base = found[0]
    overrides = {
        "count": args.count, "tp": args.tp, "pp": args.pp, "ep": getattr(args, "ep", None),
        "kv_cache_dtype": getattr(args, "kv_cache_dtype", None),
        "speculative_config": getattr(args, "speculative_config", None),
        "n_gpu_layers": args.n_gpu_layers,
        "built_for": args.built_for, "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_num_active_seqs": getattr(args, "max_num_active_seqs", None),
        "max_num_queued_reqs": getattr(args, "max_num_queued_reqs", None),
        "max_logprobs": getattr(args, "max_logprobs", None),
        "long_prefill_token_threshold": getattr(args, "long_prefill_token_threshold", None),
        "long_prefill_token_threshold_adaptive": getattr(
            args, "long_prefill_token_threshold_adaptive", None),
        "max_num_queued_tokens": getattr(args, "max_num_queued_tokens", None),
        "max_num_inflight_kv_loads": getattr(args, "max_num_inflight_kv_loads", None),
        "cache_aware_admission_window": getattr(args, "cache_aware_admission_window", None),
        "cache_aware_admission_threshold": getattr(args, "cache_aware_admission_threshold",
                                                   None),
        "block_size": getattr(args, "block_size", None),
        "kv_blocks": getattr(args, "kv_blocks", None),
        "gpu_memory_utilization": getattr(args, "gpu_memory_utilization", None),
        "kv_cache_memory_bytes": getattr(args, "kv_cache_memory_bytes", None),
        "cpu_offload_gb": getattr(args, "cpu_offload_gb", None),
        "enforce_eager": getattr(args, "enforce_eager", None),
        "policy": args.policy, "kv_layout": args.kv_layout, "batching": args.batching,
        "output_len_mean": args.output_len_mean,
        "prefix_cache": None if args.prefix_cache is None else args.prefix_cache == "on",
        "chunked_prefill": {"on": True, "off": False}.get(getattr(args, "chunked_prefill", None)),
        "start": "cold" if args.cold else None,
        "jump_forward": {"on": True, "off": False}.get(getattr(args, "jump_forward", None)),
        # --- KV events (issue 13) ---
        "kv_events_config": getattr(args, "kv_events_config", None),
        "prefix_caching_hash_algo": getattr(args, "prefix_caching_hash_algo", None),
        # --- LoRA (issue 13) ---
        "enable_lora": getattr(args, "enable_lora", None),
        "max_loras": getattr(args, "max_loras", None),
        "max_lora_rank": getattr(args, "max_lora_rank", None),
        "max_cpu_loras": getattr(args, "max_cpu_loras", None),
        "lora_modules": tuple(args.lora_modules) if getattr(args, "lora_modules", None)
        else None,
        # --- P/D and sleep mode (issue 13) ---
        "kv_transfer_config": getattr(args, "kv_transfer_config", None),
        "kv_offloading_size": getattr(args, "kv_offloading_size", None),
        "kv_offloading_backend": getattr(args, "kv_offloading_backend", None),
        "hf_overrides": getattr(args, "hf_overrides", None),
        "runner": getattr(args, "runner", None),
        "convert": getattr(args, "convert", None),
        "chat_template": getattr(args, "chat_template", None),
        "pooler_config": getattr(args, "pooler_config", None),
        "enable_sleep_mode": getattr(args, "enable_sleep_mode", None) or None,
        "checkpoint_prepare_on_startup": getattr(args, "checkpoint_prepare_on_startup",
                                                 None) or None,
        "enable_fault_tolerance": getattr(args, "enable_fault_tolerance", None) or None,
        "fault_tolerance_config": getattr(args, "fault_tolerance_config", None),
        # --- vLLM's --kv-cache-metrics (docs/OBSERVABILITY.md) ---
        "kv_cache_metrics": getattr(args, "kv_cache_metrics", None),
        "kv_cache_metrics_sample": getattr(args, "kv_cache_metrics_sample", None),
        "per_request_spec_decode_metrics": getattr(args, "per_request_spec_decode_metrics",
                                                   None),
        # ---- request limits (issue 14) ----
        **{k: getattr(args, k, None) for k in REQUEST_LIMITS},
        # ---- end request limits ----
    }
    if bad := range_problem(overrides):  # what a fleet file refuses too
        raise SimulationError(f"--{bad[0].replace('_', '-')} {bad[1]}")
    # --- failure injection (issue 13) ---
    for key in FAULT_KEYS:
        value = getattr(args, key, None)
        overrides[key] = tuple(value) if isinstance(value, list) else value
    options = dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
    try:  # bad LoRA or fault flags are a start-up error, as in vLLM
        options.lora_config()  # --- LoRA (issue 13) ---
        check_fault_options(options)
        options.check_vllm_config()
    except ValueError as e:
        raise SimulationError(str(e)) from e
    return options


# ~32 years of emulated time: the most a think time, or the arrivals' expected span, may take.
# Past it the emulated clock (a float of seconds) overflowed its sums (think times) or could
# not tell a request's arrival from its first token (a span: ulp(1e300) >> 1 ms).
MAX_EMULATED_S = 1e9


def check_workload_args(args: argparse.Namespace) -> None:
    """The workload flags' ranges, each refused by name (SimulationError)."""
    if args.duration is not None and not (math.isfinite(args.duration) and args.duration > 0):
        raise SimulationError(f"--duration must be a finite number of seconds > 0, got "
                              f"{args.duration:g}")
    n = args.num_requests or 1
    span = n / args.rate if args.rate > 0 else 0.0  # (a rate <= 0 is refused with the workload)
    if span > MAX_EMULATED_S:
        raise SimulationError(f"--rate {args.rate:g} spreads {n} arrivals over ~{span:.3g} s of "
                              f"emulated time, past {MAX_EMULATED_S:g} s (~32 years): raise --rate "
                              f"or lower --num-requests")
    if not (math.isfinite(args.think_time) and 0 <= args.think_time <= MAX_EMULATED_S):
        raise SimulationError(f"--think-time must be a number of seconds in [0, "
                              f"{MAX_EMULATED_S:g}], got {args.think_time:g}")
    if not (math.isfinite(args.ramp_up) and args.ramp_up >= 0):
        raise SimulationError(f"--ramp-up must be a finite number of seconds >= 0, got "
                              f"{args.ramp_up:g}")
    if not (math.isfinite(args.burstiness) and args.burstiness > 0):
        raise SimulationError(f"--burstiness must be a finite number > 0, got "
                              f"{args.burstiness:g}")
    if not 0 <= args.length_spread < 1:
        raise SimulationError(f"--length-spread must be in [0, 1), got {args.length_spread:g}")
    if args.system_prompt_len < 0:
        raise SimulationError(f"--system-prompt-len must be >= 0, got {args.system_prompt_len}")
    check_flags_apply(args)


def check_flags_apply(args: argparse.Namespace) -> None:
    """A workload flag the chosen workload, arrival process or length distribution would
    ignore is refused by name: `--trace t.jsonl` without `--workload trace` ran random prompts
    and reported them as if the trace had been replayed."""
    trace_format = getattr(args, "trace_format", "auto")
    for given, applies, needs in (
            (bool(args.trace), args.workload == "trace", "--trace FILE needs --workload trace"),
            (trace_format != "auto", args.workload == "trace",
             f"--trace-format {trace_format} needs --workload trace"),
            (args.mix != "random=1", args.workload == "mix", "--mix needs --workload mix"),
            (args.burstiness != 1.0, args.arrival == "gamma",
             "--burstiness shapes gamma arrivals: it needs --arrival gamma"),
            (bool(args.length_file), args.length_dist == "histogram",
             "--length-file needs --length-dist histogram"),
            (args.length_spread != 0, args.length_dist in ("uniform", "normal"),
             "--length-spread needs --length-dist uniform or normal")):
        if given and not applies:
            raise SimulationError(f"{needs} (otherwise it is ignored)")


def workload_from_args(args: argparse.Namespace) -> WorkloadSpec:
    check_workload_args(args)
    n = args.num_requests
    shape = getattr(args, "rate_shape", None)  # --- time-varying traffic (issue 16) ---
    if shape:
        if getattr(args, "rate_given", False) or args.ramp_up or args.arrival != "poisson":
            raise SimulationError("--rate-shape replaces --rate, --ramp-up and --arrival "
                                  "(its arrivals are Poisson with a time-varying rate)")
        n = n or 0  # 0: as many as arrive in --duration (or before the shape ends)
    elif n is None:
        if args.duration is not None:
            if math.isinf(args.rate):
                raise SimulationError("--duration needs a finite --rate")
            n = max(1, round(args.rate * args.duration))
        else:
            n = 100
    return WorkloadSpec(
        kind=args.workload, num_requests=n, isl=args.isl, osl=args.osl, rate=args.rate,
        arrival=args.arrival, seed=args.seed, ignore_eos=args.ignore_eos,
        system_prompt_len=args.system_prompt_len, num_prefixes=args.num_prefixes,
        users_per_prefix=args.users_per_prefix, turns=args.turns,
        think_time_s=args.think_time, burstiness=args.burstiness, ramp_up_s=args.ramp_up,
        length_dist=args.length_dist, length_spread=args.length_spread,
        length_file=args.length_file or "", mix=_parse_mix(args.mix),
        trace_path=args.trace or "",
        slo_class_mix=_parse_mix(getattr(args, "slo_class_mix", None) or "",
                                 "--slo-class-mix", "CLASS"),  # --- fleet (issue 16) ---
        rate_shape=shape or "", duration_s=args.duration if shape else None,
        trace_format=getattr(args, "trace_format", "auto"),
    )


def _parse_mix(text: str, flag: str = "--mix",
               name: str = "KIND") -> tuple[tuple[str, float], ...]:
    """`random=0.6,shared-prefix=0.4` → (("random", 0.6), ("shared-prefix", 0.4))."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, sep, weight = part.partition("=")
        try:
            out.append((kind.strip(), float(weight)))
        except ValueError:
            raise SimulationError(f"bad {flag} term {part!r}: use {name}=WEIGHT") from None
        if not sep:
            raise SimulationError(f"bad {flag} term {part!r}: use {name}=WEIGHT")
    return tuple(out)


def simulate(args: argparse.Namespace) -> dict[str, Any]:
    """`doppelchip simulate` of one deployment: streamed, so a million requests fit."""
    return simulate_streamed(options_from_args(args), workload_from_args(args),
                             SummaryStream(slo_from_args(args)))


def slo_from_args(args: argparse.Namespace) -> dict[str, float] | None:
    """`simulate --slo` (what `doppelchip plan` checks): the summary then has `slo` and
    `goodput` (the share of requests meeting every bound), as `load --slo` reports them."""
    text = getattr(args, "slo", None)
    try:
        return parse_slo(text) if text else None
    except ValueError as e:
        raise SimulationError(str(e)) from e


