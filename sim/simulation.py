"""The virtual-time path of DESIGN.md: a `clients` workload through `run_virtual`, reported by
`clients.report`. Used by `doppelchip simulate` and `doppelchip load --target sim:` (their
command line becomes options and a workload in sim/sim_args.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from clients.report import RequestResult, SummaryStream
from clients.workloads import WorkloadSpec, stream_workload
from server.engine.build import build_core
from server.engine.options import EngineOptions
from server.engine.tokenizer import get_tokenizer
from sim.reports import offload_report, pooling_report
from sim.virtual import run_virtual

# the failure-injection options (they act on the served path only: refused here)
FAULT_KEYS = ("failure_injection_rate", "failure_types", "failure_injection_seed",
              "fault_slowdown", "fault_hang", "fault_crash", "fault_lost_chips",
              "fault_stream_cut")


class SimulationError(Exception):
    """The deployment or the workload cannot be simulated; the message says why."""


def simulate_options(options: EngineOptions, workload: WorkloadSpec,
                     macro_steps: bool | None = None) -> dict[str, Any]:
    """Run `workload` on the deployment `options` in virtual time; the summary dict."""
    return simulate_conversations(options, workload, macro_steps=macro_steps)[0]


def simulate_conversations(
    options: EngineOptions, workload: WorkloadSpec, concurrency: int | None = None,
    macro_steps: bool | None = None,
) -> tuple[dict[str, Any], list[RequestResult]]:
    """The summary and every request's result of `workload` on `options` in virtual time
    (closed loop with at most `concurrency` conversations at once, if given; `macro_steps`:
    see `run_virtual`)."""
    stream = SummaryStream(keep=True)
    summary = simulate_streamed(options, workload, stream, concurrency, macro_steps)
    assert stream.records is not None
    return summary, stream.records


def simulate_streamed(
    options: EngineOptions, workload: WorkloadSpec, stream: SummaryStream,
    concurrency: int | None = None, macro_steps: bool | None = None,
) -> dict[str, Any]:
    """`simulate_conversations`' summary, its results folded into `stream` as they end and
    its conversations drawn as they start: memory stays flat with the request count (issue
    16). With `stream.slo`, the summary also has `slo` and `goodput`."""
    injected = [k for k in FAULT_KEYS if k != "failure_injection_seed" and getattr(options, k)]
    if injected:  # failure injection (issue 13) acts on the served path only
        raise SimulationError(f"{options.name}: {', '.join(injected)}: failure injection runs "
                              "in `doppelchip serve`, not in virtual time")
    try:
        core = build_core(options)
    except Exception as e:  # DeviceError, ValueError: the message says why
        raise SimulationError(f"{options.name}: {e}") from e
    workload = dataclasses.replace(workload, vocab_size=get_tokenizer().vocab_size)
    try:
        conversations = stream_workload(workload, encode=get_tokenizer().encode)
    except (ValueError, OSError) as e:
        raise SimulationError(str(e)) from e
    run = run_virtual(core, conversations, max_waiting=options.max_waiting,
                      max_grammar_bytes=options.max_grammar_bytes, concurrency=concurrency,
                      macro_steps=macro_steps, records=stream)
    sched, stats = core.scheduler.stats, core.stats
    per_mtok = 1e6 / stream.output if stream.output else 0.0
    summary = stream.summary(
        deployment=options.name,
        target="sim",
        chips=core.placement.chips,
        prefix_cache_hit_rate=sched.prefix_cache_hit_rate,
        prefill_tokens=sched.num_prefill_tokens,
        preemptions=sched.num_preemptions,
        peak_running=sched.peak_num_running,
        max_num_seqs=core.scheduler.config.max_num_seqs,
        steps=stats.steps,
        kv_usage_mean=run.kv_usage_mean,
        kv_usage_peak=run.kv_usage_peak,
        compiles=stats.compiles,
        compile_stall_s=stats.stall_s,
        cold_start_s=core.startup_s,
        jump_forward=core.jump_forward,
        **offload_report([core.scheduler]),
        joules_per_mtok=stats.joules * per_mtok,
        usd_per_mtok=stats.dollars * per_mtok,
        emulated_s=run.duration_s,
    )
    summary.update(pooling_report(core.placement.model.is_pooling, stats.joules,
                                  stats.dollars, stream.prompt))
    if stream.slo is not None:
        summary["slo"] = stream.slo
        summary["goodput"] = stream.goodput()
    return summary


# deployment limits a flag can set (`--max-prompt-bytes` ...): EngineOptions fields
