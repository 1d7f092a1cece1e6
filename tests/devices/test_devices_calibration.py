"""Calibration: what is reproduced and what only looks reproduced; leave-one-out; provenance.

A group (engine, chip class) with as many fitted points as the factors its points set
reproduces those points by construction, so no test here claims that as "reproduction": for
such groups the tests only check that the solver hits its target. Reproduction is claimed
for the groups with more points than free factors (llama.cpp on Apple: 5 points, 3 factors;
TensorRT-LLM on datacentre GPUs: 2 throughput points, 1 factor), where a residual exists, and
leave-one-out predicts each of their points from the others.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devices import BatchShape, DeploymentSpec, catalog, place, step_cost
from devices.calibration import POINTS, Point, fit, fitted_factors
from devices.factors import FACTOR_NAMES
from devices.loo import groups, leave_one_out, predict

LOO_THRESHOLD = 0.30  # stated threshold: the same ±30% the validation table is judged by
OVERDETERMINED = {g for g, (n, free) in groups().items() if n > free}
EXACT = [p for p in POINTS if p.fit and p.group not in OVERDETERMINED]
RESIDUAL = [p for p in POINTS if p.fit and p.group in OVERDETERMINED]


def test_which_groups_are_overdetermined():
    """The split the rest of this file relies on (and docs/FIDELITY.md reports)."""
    assert {("llama.cpp", "apple"), ("tensorrt-llm", "nvidia-datacentre")} == OVERDETERMINED
    assert groups()[("llama.cpp", "apple")] == (5, 3)
    assert groups()[("tensorrt-llm", "nvidia-datacentre")] == (2, 1)
    assert all(n == free for g, (n, free) in groups().items() if g not in OVERDETERMINED)


@pytest.mark.parametrize("point", RESIDUAL, ids=lambda p: p.id)
def test_overdetermined_group_reproduces_its_points(point: Point):
    """Not true by construction: more points than factors, so each point has a residual."""
    assert predict(point) == pytest.approx(point.value, rel=point.tolerance)


def test_overdetermined_groups_do_have_a_residual():
    """If every residual were ~0 the points above would not test anything."""
    assert max(abs(predict(p) / p.value - 1) for p in RESIDUAL) > 0.02


@pytest.mark.parametrize("point", EXACT, ids=lambda p: p.id)
def test_solver_hits_its_target_in_exactly_determined_groups(point: Point):
    """One factor per point: the fit solves for the point, so this checks the solver (a
    clamped or non-converged fit fails), not the physics."""
    assert predict(point) == pytest.approx(point.value, rel=0.01)


def test_leave_one_out_within_threshold():
    results = leave_one_out()
    assert {r.point for r in results} == {p.id for p in RESIDUAL}
    worst = max(results, key=lambda r: abs(r.error))
    assert abs(worst.error) <= LOO_THRESHOLD, worst


def test_leave_one_out_refits_without_the_point():
    """A left-out point really is out: the refit's factors differ from the full fit's."""
    from devices.calibration import without

    full = fitted_factors()[("llama.cpp", "apple")]
    refit = fit(without("m2u-q8-tg"))[("llama.cpp", "apple")]
    assert refit.bw_eff != full.bw_eff
    assert "m2u-q8-tg" not in refit.provenance_of("bw_eff").points


def test_every_factor_has_provenance():
    """fitted: names points of its own group; borrowed: names the group it came from, whose
    own provenance carries the same points (a chain of borrowing ends at fitted points);
    nothing else but a stated assumption or the roofline default."""
    by_id = {p.id: p for p in POINTS}
    table = fitted_factors()
    for (engine, cls), f in table.items():
        for name in FACTOR_NAMES:
            prov = f.provenance_of(name)
            assert prov.kind in ("fitted", "borrowed", "assumption", "default"), (engine, cls)
            if prov.kind == "fitted":
                assert prov.points and all(by_id[i].group == (engine, cls) for i in prov.points)
            if prov.kind == "borrowed" and prov.points:
                src_engine, _, src_cls = prov.source.partition(" on ")
                assert table[(src_engine, src_cls)].provenance_of(name).points == prov.points


def test_provenance_says_what_is_borrowed():
    table = fitted_factors()
    vllm = table[("vllm", "nvidia-datacentre")]
    assert vllm.provenance_of("flop_eff").kind == "borrowed"
    assert vllm.provenance_of("flop_eff").source == "tensorrt-llm on nvidia-datacentre"
    assert set(vllm.provenance_of("flop_eff").points) == {"trt-h100-128", "trt-h100-2048"}
    mlx = table[("mlx", "apple")]
    assert "assumption" in mlx.provenance_of("flop_eff").note
    apple = table[("llama.cpp", "apple")].provenance_of("bw_eff")
    assert apple.kind == "fitted" and len(apple.points) == 3


def test_validation_points_are_never_fitted():
    """calibration opens calibration.toml only; no validation row id appears in any
    factor's provenance."""
    import tomllib

    src = (Path(catalog.__file__).parent.parent / "calibration.py").read_text()
    assert "validation.toml" not in src and "calibration.toml" in src
    rows = tomllib.loads((Path(catalog.__file__).parent / "validation.toml").read_text())
    ids = {r["id"] for r in rows["rows"]}
    assert not ids & {p.id for p in POINTS}
    for f in fitted_factors().values():
        for _, prov in f.provenance:
            assert not ids & set(prov.points)


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
    a = place(DeploymentSpec("llama-2-7b", "q4_0", "m2-ultra-60", "llama.cpp"))
    b = place(DeploymentSpec("llama-3.1-70b", "q4_0", "m2-ultra-60", "llama.cpp"))
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
    costs = {}
    for engine in ("tensorrt-llm", "vllm"):
        pl = place(DeploymentSpec("llama-3.1-8b", "fp8", "h100-sxm", engine))
        costs[engine] = step_cost(pl, BatchShape(decode=(100,)))
    assert costs["tensorrt-llm"].kernels < costs["vllm"].kernels
    assert costs["tensorrt-llm"].bytes < costs["vllm"].bytes
    assert costs["tensorrt-llm"].seconds < costs["vllm"].seconds


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
