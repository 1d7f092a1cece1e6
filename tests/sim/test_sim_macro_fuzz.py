"""Macro-stepping against single-stepping over random configurations (a seeded fuzz beside
the per-kind checks of test_sim_macro.py): chips, engines, seats, KV block sizes, KV pool
sizes (preemption under pressure), context limits, workload kinds, lengths, rates, EOS and
think times vary; the records, every request's token ids, the counters and the figures must
agree (times 1e-9 relative), and windows must have run."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from macro_helpers import count_window_steps

import sim.virtual as virtual
from clients.workloads import WorkloadSpec, build_workload
from devices import catalog
from server.engine.build import build_core
from server.engine.options import EngineOptions
from server.engine.tokenizer import get_tokenizer

SHAPES = [("llama-2-7b", "h100-sxm", "vllm"), ("llama-2-7b", "h100-sxm", "sglang"),
          ("llama-3.1-8b", "a100-sxm-80g", "vllm"), ("llama-2-13b", "a100-sxm-80g", "vllm")]


def _draw(rng: random.Random, vocab: int) -> tuple[EngineOptions, WorkloadSpec]:
    model, chip, engine = rng.choice(SHAPES)
    # The KV pool is drawn in tokens (None: all the device holds), then cut into blocks of
    # the drawn block size (None: the engine's on the chip), so that every block size sees
    # the same pressure, preemption included.
    kv_tokens = rng.choice([None, None, 4800, 12800, 32000])
    opts = EngineOptions(name="fuzz", model=model, quant="bf16", chip=chip, engine=engine,
                         max_num_seqs=rng.choice([4, 8, 16, 64, None]),
                         max_model_len=rng.choice([None, 2048, 4096]),
                         seed=rng.randrange(1000))
    spec = WorkloadSpec(kind=rng.choice(["random", "random", "shared-prefix", "multi-turn"]),
                        num_requests=rng.randrange(5, 50),
                        isl=rng.choice([20, 64, 200, 513, 1000]),
                        osl=rng.choice([8, 40, 100, 300]),
                        rate=rng.choice([math.inf, 5, 20, 100]),
                        ignore_eos=rng.random() < 0.5,
                        length_dist=rng.choice(["fixed", "uniform"]), length_spread=0.5,
                        system_prompt_len=rng.choice([64, 300]), num_prefixes=2, turns=2,
                        think_time_s=rng.choice([0.0, 0.3]), seed=rng.randrange(100),
                        vocab_size=vocab)
    block_size = rng.choice([None, 16, 64])
    tokens_per_block = block_size or catalog.get_engine(engine).block_size_on(
        catalog.get_chip(chip))
    opts = dataclasses.replace(opts, block_size=block_size,
                               kv_blocks=kv_tokens and kv_tokens // tokens_per_block)
    return opts, spec


def _run(opts: EngineOptions, spec: WorkloadSpec, macro: bool, monkeypatch) -> tuple:
    tok = get_tokenizer()
    core = build_core(opts, tok)
    requests = []
    add = core.add_request
    monkeypatch.setattr(core, "add_request", lambda r: (requests.append(r), add(r))[1])
    steps = count_window_steps(monkeypatch)
    run = virtual.run_virtual(core, build_workload(spec, encode=tok.encode), macro_steps=macro)
    core.scheduler.check_integrity()
    s = core.scheduler.stats
    counters = (s.num_steps, s.num_generation_tokens, s.num_prefill_tokens, s.num_preemptions,
                s.prefix_cache_hits, s.peak_num_running, core.stats.steps)
    floats = (run.duration_s, run.kv_usage_mean, run.kv_usage_peak, core.stats.busy_s,
              core.stats.joules, core.stats.dollars, core.stats.flops)
    rows = [(r.request_id, r.output_tokens, r.cached_tokens, r.finish_reason, r.preemptions,
             r.error) for r in run.records]
    times = [(r.token_times, r.end_s, r.first_scheduled_s) for r in run.records]
    tokens = [(r.request_id, tuple(r.token_ids)) for r in requests]
    return counters, rows, tokens, floats, times, steps[0]


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _assert_identical(single: tuple, macro: tuple, *why: object) -> None:
    """The same records, token ids and counters; figures and times equal to 1e-9."""
    assert single[:3] == macro[:3], why
    assert all(_close(a, b) for a, b in zip(single[3], macro[3], strict=True))
    for (t1, e1, f1), (t2, e2, f2) in zip(single[4], macro[4], strict=True):
        assert len(t1) == len(t2) and all(map(_close, t1, t2)), why
        assert _close(e1, e2) and _close(f1, f2)


def _macro_is_single(opts: EngineOptions, spec: WorkloadSpec, monkeypatch) -> tuple:
    """Both runs of one configuration: windows ran and the runs are identical; the macro
    run's results."""
    single = _run(opts, spec, False, monkeypatch)
    macro = _run(opts, spec, True, monkeypatch)
    assert macro[5] > 0
    _assert_identical(single, macro)
    return macro


@pytest.mark.parametrize("seed", range(4))
def test_random_configurations_run_the_same_macro_or_single_stepped(seed, monkeypatch):
    rng = random.Random(seed)
    vocab = get_tokenizer().vocab_size
    windows = 0
    for _ in range(10):
        opts, spec = _draw(rng, vocab)
        single = _run(opts, spec, False, monkeypatch)
        macro = _run(opts, spec, True, monkeypatch)
        windows += macro[5]
        _assert_identical(single, macro, opts, spec)
    assert windows > 0  # macro-stepping really ran


@pytest.mark.parametrize("adaptive", [False, True])
def test_a_long_prefill_threshold_runs_the_same_macro_or_single_stepped(adaptive, monkeypatch):
    """vLLM's long_prefill_token_threshold changes which steps prefill what; windows still
    take only plain decode batches, so the two runs are identical."""
    opts = EngineOptions(name="cap", model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                         engine="vllm", max_num_seqs=16, max_num_batched_tokens=512,
                         long_prefill_token_threshold=64,
                         long_prefill_token_threshold_adaptive=adaptive)
    spec = WorkloadSpec(kind="random", num_requests=30, isl=1000, osl=60, rate=20,
                        length_dist="uniform", length_spread=0.9, ignore_eos=False, seed=3,
                        vocab_size=get_tokenizer().vocab_size)
    macro = _macro_is_single(opts, spec, monkeypatch)
    uncapped = _run(dataclasses.replace(opts, long_prefill_token_threshold=0), spec, True,
                    monkeypatch)
    assert uncapped[0] != macro[0]  # the cap really changed the schedule


def test_cache_aware_admission_runs_the_same_macro_or_single_stepped(monkeypatch):
    """vLLM 0.34.0's cache-aware admission reorders the waiting queue every step (ties keep
    the last order), so no window runs while two requests wait; the two runs are identical,
    and the window really changed which request went first."""
    # 120 blocks of 16 tokens (1920): a pool short enough that requests wait on KV and the
    # window has a queue to reorder
    opts = EngineOptions(name="aware", model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                         engine="vllm", max_num_seqs=8, block_size=16, kv_blocks=120,
                         cache_aware_admission_window=16, cache_aware_admission_threshold=0.0)
    spec = WorkloadSpec(kind="shared-prefix", num_requests=60, isl=300, osl=80, rate=40,
                        system_prompt_len=256, num_prefixes=5, users_per_prefix=1,
                        ignore_eos=True, seed=5,
                        vocab_size=get_tokenizer().vocab_size)
    macro = _macro_is_single(opts, spec, monkeypatch)
    plain = _run(dataclasses.replace(opts, cache_aware_admission_window=0), spec, True,
                 monkeypatch)
    first = [t[2] for t in macro[4]]  # each request's first-scheduled time
    assert first != [t[2] for t in plain[4]]  # the window changed the admission order
