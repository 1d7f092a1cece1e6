"""Macro-stepping (server/engine/macro.py) gives the very run single-stepping gives.

Each workload kind runs twice on a fresh core, single-stepped and macro-stepped: the records
(token times, first-scheduled times, tokens counts, finish reasons), the scheduler's and the
core's counters and the KV usage figures must be equal (times to 1e-9 relative), and the
macro-stepped run must really have advanced windows of several steps at once."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

import sim.virtual as virtual
import sim.virtual_macro as virtual_macro
from clients.workloads import WorkloadSpec, build_workload
from server.engine.build import build_core
from server.engine.macro import Window
from server.engine.options import EngineOptions
from server.engine.tokenizer import get_tokenizer

H100 = EngineOptions(name="h100", model="llama-2-7b", quant="bf16", chip="h100-sxm",
                     engine="vllm")
SMALL_KV = dataclasses.replace(H100, max_num_seqs=8)  # seats full: a waiting queue builds


def _run(options: EngineOptions, spec: WorkloadSpec, macro: bool, monkeypatch) -> tuple:
    tok = get_tokenizer()
    spec = dataclasses.replace(spec, vocab_size=tok.vocab_size)
    core = build_core(options, tok)
    steps_in_windows = [0]
    real = virtual_macro.advance

    def counting(*a, **k):
        out = real(*a, **k)
        if isinstance(out, Window):
            steps_in_windows[0] += len(out.seconds)
        return out

    monkeypatch.setattr(virtual_macro, "advance", counting)
    run = virtual.run_virtual(core, build_workload(spec, encode=tok.encode),
                              macro_steps=macro)
    s = core.scheduler.stats
    counters = (s.num_steps, s.num_generation_tokens, s.num_prefill_tokens, s.num_preemptions,
                s.prefix_cache_hits, s.peak_num_running, core.stats.steps, core.stats.compiles)
    floats = (run.duration_s, run.kv_usage_mean, run.kv_usage_peak, core.stats.busy_s,
              core.stats.joules, core.stats.dollars, core.stats.flops)
    return run.records, counters, floats, steps_in_windows[0]


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _assert_same(single, macro, windows_expected: bool = True) -> None:
    recs1, counters1, floats1, _ = single
    recs2, counters2, floats2, windows = macro
    # constrained (structured) requests are single-stepped by design: no window runs then
    assert (windows > 0) == windows_expected, windows
    assert counters1 == counters2
    assert all(_close(a, b) for a, b in zip(floats1, floats2, strict=True)), (floats1, floats2)
    assert len(recs1) == len(recs2)
    for r1, r2 in zip(recs1, recs2, strict=True):
        assert (r1.request_id, r1.output_tokens, r1.cached_tokens, r1.finish_reason,
                r1.preemptions, r1.error) == (r2.request_id, r2.output_tokens, r2.cached_tokens,
                                              r2.finish_reason, r2.preemptions, r2.error)
        assert len(r1.token_times) == len(r2.token_times)
        assert all(_close(a, b) for a, b in zip(r1.token_times, r2.token_times, strict=True))
        assert _close(r1.end_s, r2.end_s) and _close(r1.first_scheduled_s, r2.first_scheduled_s)


WORKLOADS = {
    "random-eos": WorkloadSpec(kind="random", num_requests=40, isl=200, osl=96, rate=20,
                               ignore_eos=False),
    "random-burst": WorkloadSpec(kind="random", num_requests=30, isl=64, osl=80,
                                 length_dist="uniform", length_spread=0.5),
    "shared-prefix": WorkloadSpec(kind="shared-prefix", num_requests=24, isl=40, osl=64,
                                  rate=30, system_prompt_len=256, num_prefixes=2),
    "multi-turn": WorkloadSpec(kind="multi-turn", num_requests=8, isl=50, osl=48, turns=3,
                               rate=10, think_time_s=0.05),
    "structured": WorkloadSpec(kind="structured", num_requests=12, isl=40, osl=64, rate=20),
    "mix": WorkloadSpec(kind="mix", num_requests=24, isl=60, osl=64, rate=30,
                        mix=(("random", 0.5), ("shared-prefix", 0.3), ("structured", 0.2))),
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_macro_equals_single_stepping(name, monkeypatch):
    spec = WORKLOADS[name]
    _assert_same(_run(H100, spec, False, monkeypatch), _run(H100, spec, True, monkeypatch),
                 windows_expected=name != "structured")


def test_macro_with_full_seats_and_a_trace(tmp_path, monkeypatch):
    """A trace replay on a deployment whose seats fill (the waiting queue is never empty)."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps({"timestamp": i * 0.01, "input_length": 30 + i,
                                           "output_length": 40 + (i * 7) % 50,
                                           "ignore_eos": i % 2 == 0})
                               for i in range(30)))
    spec = WorkloadSpec(kind="trace", trace_path=str(trace))
    _assert_same(_run(SMALL_KV, spec, False, monkeypatch),
                 _run(SMALL_KV, spec, True, monkeypatch))


def test_macro_under_kv_pressure_evicts_and_preempts_as_single_stepping(monkeypatch):
    """A pool small enough that decodes evict cached blocks inside windows and the scheduler
    preempts: windows stop before an allocation the pool cannot cover."""
    # 60 blocks of 16 tokens (960) for 16 seats: the pool is short (60 of the default
    # 64-token blocks would be four times the pool, and nothing would be preempted)
    tight = dataclasses.replace(H100, block_size=16, kv_blocks=60, max_num_seqs=16)
    spec = WorkloadSpec(kind="shared-prefix", num_requests=30, isl=40, osl=120, rate=40,
                        system_prompt_len=96, num_prefixes=3, ignore_eos=True)
    single, macro = _run(tight, spec, False, monkeypatch), _run(tight, spec, True, monkeypatch)
    _assert_same(single, macro)
    assert single[1][3] > 0  # preemptions happened: the pool really was short


def _cluster(spec: WorkloadSpec, macro: bool) -> tuple:
    tok = get_tokenizer()
    spec = dataclasses.replace(spec, vocab_size=tok.vocab_size)
    cores = [build_core(H100, tok) for _ in range(3)]
    turn = iter(range(10**9))
    run = virtual.run_cluster(cores, build_workload(spec, encode=tok.encode),
                              lambda prompt, outstanding, s: next(turn) % 3, macro_steps=macro)
    counters = [(c.scheduler.stats.num_steps, c.stats.steps, c.scheduler.stats.num_preemptions)
                for c in cores]
    floats = (run.duration_s, run.kv_usage_mean, run.kv_usage_peak,
              *(c.stats.busy_s for c in cores), *(c.stats.joules for c in cores))
    return sorted(run.records, key=lambda r: r.request_id), counters, floats


def test_macro_cluster_equals_single_stepping():
    """Three cores on one clock behind round robin: each core's windows end at the next
    arrival, so routing sees the state single-stepping gives (records compared by id: a
    window's finishes are recorded when it is computed)."""
    spec = WorkloadSpec(kind="random", num_requests=45, isl=100, osl=80, rate=60,
                        ignore_eos=False)
    (recs1, c1, f1), (recs2, c2, f2) = _cluster(spec, False), _cluster(spec, True)
    assert c1 == c2
    assert all(_close(a, b) for a, b in zip(f1, f2, strict=True)), (f1, f2)
    for r1, r2 in zip(recs1, recs2, strict=True):
        assert (r1.request_id, r1.output_tokens, r1.replica) == (r2.request_id,
                                                                 r2.output_tokens, r2.replica)
        assert all(_close(a, b) for a, b in zip(r1.token_times, r2.token_times, strict=True))


def test_no_macro_steps_flag_gives_the_same_summary(capsys):
    """`simulate --no-macro-steps` single-steps: the summary is the macro-stepped one."""
    from doppelchip.cli import main

    cmd = ["simulate", "--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-2-7b",
           "--quant", "bf16", "--workload", "random", "--isl", "200", "--osl", "64",
           "--num-requests", "40", "--rate", "20", "--json"]
    calls = []
    real = virtual_macro.advance

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    virtual_advance = virtual_macro.advance
    try:
        virtual_macro.advance = counting
        summaries = []
        for extra in ([], ["--no-macro-steps"]):
            before = len(calls)
            assert main([*cmd, *extra]) == 0
            summaries.append((json.loads(capsys.readouterr().out.strip().splitlines()[-1]),
                              len(calls) - before))
    finally:
        virtual_macro.advance = virtual_advance
        virtual.MACRO_STEPS["default"] = True
    (macro, n_macro), (single, n_single) = summaries
    assert n_macro > 0 and n_single == 0  # the flag really switched windows off
    assert macro.keys() == single.keys()
    for key, value in macro.items():
        if isinstance(value, float):
            assert _close(value, single[key]), key
        elif isinstance(value, dict):
            assert all(_close(v, single[key][k]) for k, v in value.items()), key
        else:
            assert value == single[key], key


def _count_heads(monkeypatch) -> dict[str, int]:
    """Patch `virtual_macro.advance` to count the windows that began with an admission step
    and the admission steps it ran alone (not windowable)."""
    seen = {"windows": 0, "alone": 0}
    real = virtual_macro.advance

    def counting(*a, **k):
        out = real(*a, **k)
        if isinstance(out, Window) and out.admission is not None:
            seen["windows"] += 1
        elif out is not None and not isinstance(out, Window):
            seen["alone"] += 1
        return out

    monkeypatch.setattr(virtual_macro, "advance", counting)
    return seen


def test_a_window_begins_with_the_step_that_admits_an_arrival(monkeypatch):
    """Arrivals while others decode: the step that prefills each one heads a window (its
    tokens and the new request's first one from the window's draws), and the run is still
    single-stepping's, first-scheduled times included."""
    spec = WorkloadSpec(kind="random", num_requests=40, isl=200, osl=96, rate=40,
                        ignore_eos=False)
    single = _run(H100, spec, False, monkeypatch)
    seen = _count_heads(monkeypatch)
    macro = _run(H100, spec, True, monkeypatch)
    _assert_same(single, macro)
    assert seen["windows"] >= 10, seen  # most arrivals find others decoding


def test_an_admission_a_window_cannot_continue_runs_as_one_step(monkeypatch):
    """Prompts longer than the step's token budget are prefilled in chunks: the admission
    step leaves a chunk for the next step, so it runs alone, as `EngineCore.step` would."""
    chunked = dataclasses.replace(H100, max_num_batched_tokens=128)
    spec = WorkloadSpec(kind="random", num_requests=20, isl=300, osl=60, rate=40)
    single = _run(chunked, spec, False, monkeypatch)
    seen = _count_heads(monkeypatch)
    macro = _run(chunked, spec, True, monkeypatch)
    _assert_same(single, macro)
    assert seen["alone"] > 0, seen
