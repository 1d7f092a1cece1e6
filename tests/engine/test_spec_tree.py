"""SGLang's speculative decoding in the engine (devices/speculative.py, server/engine/speculate.py):
its simulated acceptance (`acceptance_length`: one length per verification step for the whole
batch, ⌊L⌋ or ⌊L⌋ + 1 with mean L, or a rounded normal draw) and EAGLE trees (`eagle_topk` > 1:
the tree's drafts verified at once, at most its depth accepted), priced by the roofline: a tree
costs little more than a chain while decoding is memory-bound, and much more once the batch
makes it compute-bound."""

from __future__ import annotations

import json

import numpy as np
import pytest

from devices import BatchShape, DeploymentSpec, SpeculativeConfig, place, step_cost
from server.engine.build import build_core
from server.engine.options import EngineOptions
from server.engine.request import Request, SamplingParams

BASE = dict(name="x", model="llama-3.1-8b", quant="bf16", chip="h100-sxm", engine="sglang",
            max_model_len=1024)


def run(spec: dict | None, n: int = 8, max_tokens: int = 120):
    """Every request's tokens, and per step the accepted drafts of each request it verified
    (check_integrity after every step: a tree's lookahead slots included)."""
    config = json.dumps(spec) if spec else None
    core = build_core(EngineOptions(**BASE, speculative_config=config,
                                    per_request_spec_decode_metrics="detailed" if spec
                                    else "none"))
    reqs = [Request(f"r{i}", [16 + (11 * i + j) % 700 for j in range(40)],
                    SamplingParams(max_tokens=max_tokens, seed=i, ignore_eos=True))
            for i in range(n)]
    for r in reqs:
        core.add_request(r)
    steps: list[dict[str, tuple[int, int]]] = []
    while core.has_unfinished():
        seen = {r.request_id: len(r.spec_decode_metrics.per_step_accepted) if spec else 0
                for r in reqs}
        assert core.step() is not None
        core.scheduler.check_integrity()
        if spec:
            steps.append({r.request_id: (r.spec_decode_metrics.per_step_accepted[-1],
                                         r.spec_decode_metrics.per_step_drafted[-1])
                          for r in reqs
                          if len(r.spec_decode_metrics.per_step_accepted) > seen[r.request_id]})
    return {r.request_id: list(r.output_token_ids) for r in reqs}, steps, core


def chain(length: float, method: str = "match-expected", k: int = 3) -> dict:
    return {"method": "eagle3", "num_speculative_tokens": k, "acceptance_length": length,
            "acceptance_method": method}


def test_match_expected_gives_one_length_per_step_with_the_mean_asked_for():
    _, steps, core = run(chain(2.3), max_tokens=300)
    verified = [s for s in steps if s]
    for s in verified:  # the whole batch accepts the step's one draw
        assert len({a for a, _ in s.values()}) == 1
    drawn = [next(iter(s.values()))[0] + 1 for s in verified]  # tokens: drafts + the bonus
    assert set(drawn) == {2, 3}  # ⌊2.3⌋ or ⌊2.3⌋ + 1, nothing else
    assert len(drawn) > 100 and np.mean(drawn) == pytest.approx(2.3, abs=0.1), np.mean(drawn)
    # (the core counts the same steps: vllm:spec_decode_* and sglang:spec_*)
    assert core.stats.spec_num_accepted_tokens == sum(a for s in steps for a, _ in s.values())


def test_multinomial_draws_spread_and_clamp_to_what_the_steps_can_accept():
    cfg = SpeculativeConfig("eagle3", 3, acceptance_length=2.3, acceptance_method="multinomial")
    _, steps, _ = run(chain(2.3, "multinomial"), n=4, max_tokens=300)
    drawn = [next(iter(s.values()))[0] + 1 for s in steps if s]
    assert set(drawn) == {1, 2, 3, 4}  # a normal draw around 2.3, clamped to [1, 3 + 1]
    assert np.mean(drawn) == pytest.approx(cfg.expected_tokens_per_step, abs=0.15)
    _, steps, _ = run(chain(9.0), n=2, max_tokens=40)  # past what 3 drafts can give
    assert {a for s in steps for a, _ in s.values()} == {3}


def test_the_expected_length_is_sglangs_clamped_and_rounded_draw():
    """Checked against a million draws of SGLang's own rule (round(clamp(N(L, 1), 1, K + 1)))."""
    rng = np.random.default_rng(0)
    for length, k in ((2.3, 3), (0.5, 2), (4.8, 4)):
        draws = np.round(np.clip(rng.normal(length, 1.0, 1_000_000), 1, k + 1))
        cfg = SpeculativeConfig("eagle", k, acceptance_length=length,
                                acceptance_method="multinomial")
        assert cfg.expected_tokens_per_step == pytest.approx(draws.mean(), abs=0.005)
        assert SpeculativeConfig("eagle", k, acceptance_length=length) \
            .expected_tokens_per_step == min(max(length, 1.0), k + 1)


def test_a_tree_verifies_its_width_accepts_at_most_its_depth_and_changes_no_token():
    tree = {**chain(5.0, k=2), "eagle_topk": 4, "num_draft_tokens": 8}
    out, steps, core = run(tree)
    plain, _, _ = run(None)
    assert out == plain  # the accepted drafts are the model's own tokens
    pairs = {p for s in steps for p in s.values()}
    # 7 drafts verified per step (the lookahead check_integrity allowed), 2 accepted: the
    # tree's depth, though the length asked for (5) would take more
    assert pairs == {(2, 7)}
    assert core.scheduler.config.num_speculative_tokens == 7
    verified = sum(len(s) for s in steps)  # request-steps, each accepting both positions
    assert core.stats.spec_num_accepted_tokens_per_pos == [verified] * 2
    # a per-position rate (vLLM's key) on a tree: every draft accepted still stops at the depth,
    # and so does a normal draw far past it (SGLang's clamp to the steps + 1)
    certain = {"method": "eagle3", "num_speculative_tokens": 2, "acceptance_rate": 1.0,
               "eagle_topk": 4, "num_draft_tokens": 8}
    for spec in (certain, {**tree, "acceptance_length": 6.0, "acceptance_method": "multinomial"}):
        _, steps, _ = run(spec, n=2, max_tokens=40)
        assert {p for s in steps for p in s.values()} == {(2, 7)}


@pytest.mark.parametrize("bad, says", [
    ({"eagle_topk": 4}, "needs num_draft_tokens"),
    ({"eagle_topk": 4, "num_draft_tokens": 22}, "from 2 to 21"),  # 4 + 1 × 16 + 1
    ({"num_draft_tokens": 5}, "= 3 for a chain"),
    ({"acceptance_length": 0}, "acceptance_length must be > 0"),
    ({"acceptance_method": "uniform"}, "acceptance_method 'uniform'"),
    ({"acceptance_rate": 0.5}, "one of 'acceptance_rate' and 'acceptance_length'"),
])
def test_what_a_tree_or_the_simulated_length_cannot_be_is_refused(bad, says):
    with pytest.raises(ValueError, match=says):
        SpeculativeConfig.parse({**chain(2.0, k=2), **bad})


def _step_s(spec: SpeculativeConfig, batch: int, ctx: int = 2048) -> float:
    placement = place(DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "sglang",
                                     speculative=spec))
    shape = BatchShape.speculating((), (ctx,) * batch, spec)
    cost = step_cost(placement, shape)
    assert cost.tokens == batch * (1 + spec.drafts_per_step)  # the verification's tokens
    return cost.seconds


def test_a_tree_costs_what_its_wider_passes_cost_on_the_roofline():
    chain5 = SpeculativeConfig("eagle3", 5, acceptance_length=2.5)
    tree = SpeculativeConfig("eagle3", 5, acceptance_length=2.5, eagle_topk=4,
                             num_draft_tokens=8)
    # batch 1 reads the weights either way (memory-bound): the tree's extra rows are nearly
    # free; at batch 256 every row is compute, and 8 verified tokens and 4-wide draft passes
    # cost much more than 6 and 1-wide
    assert _step_s(tree, 1) / _step_s(chain5, 1) < 1.1
    assert _step_s(tree, 256) / _step_s(chain5, 256) > 1.3
    one_wide = SpeculativeConfig("eagle3", 5, acceptance_length=2.5, eagle_topk=1,
                                 num_draft_tokens=6)
    assert _step_s(one_wide, 64) == _step_s(chain5, 64)  # topk 1 is the chain
