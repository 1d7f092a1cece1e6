"""Compile strategies (stateful) and jitter."""

from __future__ import annotations

import pytest

from devices import (
    BatchShape,
    DeploymentSpec,
    ShapeError,
    make_compile_strategy,
    make_jitter,
    place,
)
from devices.compile import build_seconds
from devices.jitter import Jitter


def test_eager_engine_never_stalls():
    pl = place(DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm"))
    c = make_compile_strategy(pl)
    assert c.kind == "none"
    assert c.before_step(BatchShape(decode=(1, 2, 3))).seconds == 0
    assert c.startup_seconds(cold=False) == 0 and c.startup_seconds(cold=True) > 0


def test_tensorrt_build_time_and_limits():
    assert build_seconds(1e9) == pytest.approx(120, rel=0.1)
    assert 600 < build_seconds(70e9) < 2400  # blogs: 10–40 min for large models
    spec = DeploymentSpec("llama-3.1-8b", "fp8", "h100-sxm", "tensorrt-llm", max_batch=8,
                          max_input_len=1024, max_seq_len=2048)
    c = make_compile_strategy(place(spec))
    assert c.startup_seconds(cold=True) > build_seconds(8e9)
    assert c.startup_seconds(cold=False) == 0
    assert c.before_step(BatchShape(decode=(10,) * 8)).reason is None
    for bad in (BatchShape(decode=(10,) * 9), BatchShape(prefill=((2000, 0),)),
                BatchShape(decode=(2048,))):
        with pytest.raises(ShapeError, match="build limits"):
            c.before_step(bad)


def test_per_shape_compiles_once_per_bucket_and_pads():
    pl = place(DeploymentSpec("llama-3.1-8b", "bf16", "tpu-v5e", "jetstream", count=8))
    warm = make_compile_strategy(pl)  # JetStream's warm-up compiled its buckets
    assert warm.before_step(BatchShape(prefill=((100, 0),))).seconds == 0  # ahead of time
    assert warm.before_step(BatchShape(decode=(5,) * 3)).seconds == 0  # warmed decode bucket
    first = warm.before_step(BatchShape(decode=(5,) * 300))  # beyond the batch cap
    assert first.seconds > 0 and "512" in first.reason
    assert warm.before_step(BatchShape(decode=(5,) * 400)).seconds == 0  # same bucket
    assert warm.compiles == 1
    padded = warm.padded(BatchShape(prefill=((100, 0),), decode=(5, 6, 7)))
    assert padded.prefill == ((128, 0),) and len(padded.decode) == 4
    # a cold start pays the warm-up (every bucket) up front, on top of the weights' load
    per = pl.engine.compile_seconds
    assert warm.startup_seconds(cold=True) - pl.load_seconds == pytest.approx(
        per * len(warm._warm_keys()))
    assert warm.startup_seconds(cold=False) == 0


def test_mlx_compiles_new_shapes():
    pl = place(DeploymentSpec("llama-3.1-8b", "mlx-4bit", "m4-max-40", "mlx"))
    c = make_compile_strategy(pl)
    assert c.kind == "per_shape"
    assert c.before_step(BatchShape(decode=(5,))).seconds > 0
    assert c.before_step(BatchShape(decode=(6,))).seconds == 0
    assert c.padded(BatchShape(decode=(1, 2, 3))) == BatchShape(decode=(1, 2, 3))


def test_groq_static_program_recompiles_on_shape_change():
    pl = place(DeploymentSpec("llama-2-70b", "f16", "groq-lpu-v1", "groq"))
    c = make_compile_strategy(pl)
    assert c.before_step(BatchShape(decode=(100,))).seconds == 0  # compiled: batch 1
    stall = c.before_step(BatchShape(decode=(100, 100)))
    assert stall.seconds > 0 and "recompile" in stall.reason
    assert c.before_step(BatchShape(decode=(101, 102))).seconds == 0
    assert c.fits_compiled(BatchShape(decode=(5,)))
    assert c.padded(BatchShape(decode=(5,))).decode == (5, 5)  # pad to the compiled batch
    assert c.before_step(BatchShape(decode=(5,))).seconds > 0  # or recompile
    assert c.compiles == 2


def test_groq_holding_the_compiled_batch_pads_instead_of_recompiling():
    pl = place(DeploymentSpec("llama-2-70b", "f16", "groq-lpu-v1", "groq", max_batch=4))
    c = make_compile_strategy(pl, hold=True)
    for batch in ((100,), (100, 100), (5, 6, 7, 8), (9,)):
        assert c.before_step(BatchShape(decode=batch)).seconds == 0
        assert len(c.padded(BatchShape(decode=batch)).decode) == 4
    assert c.compiles == 0


def test_jitter_default_deterministic_seeded_and_zero_for_groq():
    vllm = place(DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm"))
    groq = place(DeploymentSpec("llama-2-70b", "f16", "groq-lpu-v1", "groq"))
    assert make_jitter(vllm).apply(0.01) == 0.01
    a = [make_jitter(vllm, sigma=0.1, seed=7).apply(0.01) for _ in range(2)]
    assert a[0] == a[1] != 0.01
    j = Jitter(0.1, seed=1)
    samples = [j.apply(1.0) for _ in range(4000)]
    assert sum(samples) / len(samples) == pytest.approx(1.0, abs=0.01)
    assert make_jitter(groq, sigma=0.5, seed=3).apply(0.01) == 0.01
