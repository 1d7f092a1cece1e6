"""Calibration: every published point is reproduced; leave-one-out predicts; no fudge keys."""

from __future__ import annotations

import pytest

from devices import catalog, estimate, place
from devices.calibration import POINTS, Point, fit, fitted_factors, without
from devices.placement import FactorTable

SINGLE = [p for p in POINTS if p.kind in ("decode", "prefill")]
THROUGHPUT = [p for p in POINTS if p.kind == "throughput"]
KEY = {"decode": "decode_tokens_per_s", "prefill": "prefill_tokens_per_s",
       "throughput": "end_to_end_tokens_per_s"}


def predict(p: Point, table: FactorTable | None = None) -> float:
    batch = p.batch
    if p.kind == "throughput":  # "max throughput": as many as the KV cache holds
        batch = min(batch, place(p.spec, table).max_concurrency(p.prompt + p.output))
    result = estimate(p.spec, p.prompt, p.output, batch, factor_table=table)
    assert result["fits"], result
    return result[KEY[p.kind]]


@pytest.mark.parametrize("point", SINGLE, ids=[p.id for p in SINGLE])
def test_single_stream_point_reproduced_within_20_percent(point: Point):
    assert predict(point) == pytest.approx(point.value, rel=0.20)


@pytest.mark.parametrize("point", [p for p in THROUGHPUT if p.fit], ids=lambda p: p.id)
def test_fitted_throughput_point_reproduced(point: Point):
    assert predict(point) == pytest.approx(point.value, rel=point.tolerance)


def _loo_cases() -> list[Point]:
    """Points with another point of the same chip class and kind left to fit from (a lone
    prefill point cannot be predicted from a decode point: they set different factors)."""
    return [
        p for p in SINGLE
        if any(q is not p and q.group[1] == p.group[1] and q.kind == p.kind for q in SINGLE)
    ]


@pytest.mark.parametrize("point", _loo_cases(), ids=lambda p: p.id)
def test_leave_one_out_predicts_within_35_percent(point: Point):
    table = fit(without(point.id))
    assert predict(point, table) == pytest.approx(point.value, rel=0.35)


def test_leave_one_out_has_cases_for_every_multi_point_class():
    classes = {p.group[1] for p in _loo_cases()}
    assert "apple" in classes
    assert len(_loo_cases()) >= 5


def test_factors_are_keyed_by_engine_and_chip_class_only():
    engines = {e.id for e in catalog.list_engines()}
    classes = set(catalog.chip_classes())
    chips = {c.id for c in catalog.list_chips(None)}
    models = {m.id for m in catalog.list_models()}
    table = fitted_factors()
    for engine, cls in table:
        assert engine in engines and cls in classes
        assert cls not in chips and cls not in models and engine not in models
    for (engine, cls), f in table.items():
        assert 0 < f.bw_eff <= 1 and 0 < f.flop_eff <= 1 and f.kernel_s >= 0, (engine, cls)
        for m in models:
            assert m not in f.origin  # the fit never records a model


def test_two_models_on_one_engine_and_chip_share_factors():
    a = place(catalog_spec("llama-2-7b", "q4_0"))
    b = place(catalog_spec("llama-3.1-70b", "q4_0"))
    assert a.factors == b.factors


def test_fit_keys_do_not_depend_on_which_model_a_point_used():
    """Swap every point's model for another one: the factors change value (the physics of a
    different model) but the table is keyed by exactly the same (engine, chip class) pairs."""
    swap = {"llama-2-7b": "llama-2-13b", "llama-2-70b": "llama-2-70b",
            "llama-3.1-8b": "llama-3-8b", "llama-3-8b": "llama-3.1-8b"}
    swapped = tuple(Point(**{**p.__dict__, "model": swap[p.model]}) for p in POINTS)
    table = fit(swapped)
    assert set(table) == set(fitted_factors())
    assert table[("llama.cpp", "apple")] != fitted_factors()[("llama.cpp", "apple")]


def test_fused_engine_pays_less_fixed_overhead():
    """TensorRT-LLM fuses adjacent layers: fewer launches and less intermediate traffic."""
    from devices import BatchShape, DeploymentSpec, step_cost

    costs = {}
    for engine in ("tensorrt-llm", "vllm"):
        pl = place(DeploymentSpec("llama-3.1-8b", "fp8", "h100-sxm", engine))
        costs[engine] = step_cost(pl, BatchShape(decode=(100,)))
    assert costs["tensorrt-llm"].kernels < costs["vllm"].kernels
    assert costs["tensorrt-llm"].bytes < costs["vllm"].bytes
    assert costs["tensorrt-llm"].seconds < costs["vllm"].seconds


def catalog_spec(model: str, quant: str):
    from devices import DeploymentSpec

    return DeploymentSpec(model, quant, "m2-ultra-60", "llama.cpp")


def test_every_engine_chip_pair_the_catalogue_allows_has_factors():
    table = fitted_factors()
    for e in catalog.list_engines():
        for cls in e.chip_classes:
            assert (e.id, cls) in table


def test_m2_ultra_fit_matches_hardware_md_derivation():
    """hardware.md: efficiency ≈ 0.88 plus a fixed ≈ 5.9 ms per token fits the three rows."""
    f = fitted_factors()[("llama.cpp", "apple")]
    assert f.bw_eff == pytest.approx(0.88, abs=0.03)
    assert 32 * 20 * f.kernel_s == pytest.approx(5.9e-3, rel=0.15)
