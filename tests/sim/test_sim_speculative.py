"""Speculative decoding: same tokens, more tokens per step, shorter inter-token latency at
small batch (less at large), vLLM's spec-decode counters, deterministic under the seed."""

from __future__ import annotations

import json

import pytest

from clients.workloads import WorkloadSpec
from devices import BatchShape, DeploymentSpec, SpeculativeConfig, estimate, place, step_cost
from server.engine.build import build_core
from server.engine.options import EngineOptions
from server.engine.request import Request, SamplingParams
from sim.simulation import simulate_conversations

SPEC = {"method": "eagle3", "num_speculative_tokens": 3, "acceptance_rate": 0.7}
BASE = dict(name="x", model="llama-3.1-8b", quant="bf16", chip="h100-sxm", engine="vllm")


def run(opts: EngineOptions, n: int = 6, max_tokens: int = 200, ignore_eos: bool = False):
    """Run `n` requests to completion on a core; their output token ids and the core."""
    core = build_core(opts)
    for i in range(n):
        prompt = [16 + (7 * i + j) % 500 for j in range(40 + 13 * i)]
        core.add_request(Request(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens, seed=i,
                                                                   ignore_eos=ignore_eos)))
    outputs: dict[str, list[int]] = {}
    steps = 0
    while core.has_unfinished():
        result = core.step()
        assert result is not None
        steps += 1
        for req in result.finished:
            outputs[req.request_id] = req.output_token_ids
    sched = core.scheduler
    sched.check_integrity()  # lookahead slots of rejected drafts are not leaked
    assert sched.pool.num_free + sched.cache.evictable_blocks == sched.pool.num_blocks
    return outputs, core, steps


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_outputs_are_identical_with_and_without_speculation(ignore_eos: bool):
    plain, _, plain_steps = run(EngineOptions(**BASE), ignore_eos=ignore_eos)
    spec, core, spec_steps = run(EngineOptions(**BASE, speculative_config=json.dumps(SPEC)),
                                 ignore_eos=ignore_eos)
    assert spec == plain and len(plain) == 6
    assert spec_steps < plain_steps  # the same tokens in fewer steps
    assert core.stats.spec_num_drafts > 0


def test_tokens_per_step_follow_the_acceptance_rate():
    _, core, _ = run(EngineOptions(**BASE, speculative_config=json.dumps(SPEC)), n=8,
                     max_tokens=400, ignore_eos=True)
    st = core.stats
    expected = SpeculativeConfig.parse(SPEC).expected_tokens_per_step  # 1 + .7 + .49 + .343
    assert expected == pytest.approx(2.533, abs=1e-3)
    assert st.spec_num_draft_tokens == 3 * st.spec_num_drafts
    mean_len = 1 + st.spec_num_accepted_tokens / st.spec_num_drafts  # vLLM's mean acceptance
    assert mean_len == pytest.approx(expected, rel=0.05)
    per_pos = [c / st.spec_num_drafts for c in st.spec_num_accepted_tokens_per_pos]
    assert per_pos == pytest.approx([0.7, 0.49, 0.343], abs=0.04)
    assert sum(st.spec_num_accepted_tokens_per_pos) == st.spec_num_accepted_tokens


def test_acceptance_is_deterministic_under_the_seed():
    opts = EngineOptions(**BASE, speculative_config=json.dumps(SPEC))
    a, b = run(opts)[1].stats, run(opts)[1].stats
    assert (a.spec_num_drafts, a.spec_num_accepted_tokens) == (b.spec_num_drafts,
                                                                b.spec_num_accepted_tokens)
    other = run(EngineOptions(**BASE, seed=5, speculative_config=json.dumps(SPEC)))[1].stats
    assert other.spec_num_accepted_tokens != a.spec_num_accepted_tokens


def test_a_zero_acceptance_rate_gains_nothing_and_costs_the_drafts():
    zero = {**SPEC, "acceptance_rate": 0.0}
    plain, _, plain_steps = run(EngineOptions(**BASE), ignore_eos=True)
    spec, core, steps = run(EngineOptions(**BASE, speculative_config=json.dumps(zero)),
                            ignore_eos=True)
    assert spec == plain and steps == plain_steps
    assert core.stats.spec_num_accepted_tokens == 0
    assert core.stats.busy_s > run(EngineOptions(**BASE), ignore_eos=True)[1].stats.busy_s


def test_itl_falls_by_the_expected_factor_at_batch_1_and_less_at_large_batch():
    """Simulated ITL at batch 1 shrinks by tokens-per-step × (plain step / speculative step),
    and by less at large batch, where verifying 1 + k tokens per sequence is no longer free."""
    cfg = SpeculativeConfig.parse(SPEC)
    work = WorkloadSpec(num_requests=4, isl=256, osl=256, ignore_eos=True)
    plain, _ = simulate_conversations(EngineOptions(**BASE), work, concurrency=1)
    spec, _ = simulate_conversations(EngineOptions(**BASE, speculative_config=json.dumps(SPEC)),
                                     work, concurrency=1)
    pl_plain = place(DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm"))
    pl_spec = place(DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm", speculative=cfg))
    ctx = 256 + 128
    t_plain = step_cost(pl_plain, BatchShape(decode=(ctx,))).seconds
    t_spec = step_cost(pl_spec, BatchShape(decode=(ctx,), spec_tokens=3)).seconds
    expected = cfg.expected_tokens_per_step * t_plain / t_spec
    gain_b1 = plain["itl_s"]["mean"] / spec["itl_s"]["mean"]
    assert gain_b1 == pytest.approx(expected, rel=0.08)
    assert gain_b1 > 1.5

    def tpot(batch: int, speculative: SpeculativeConfig | None) -> float:
        s = DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm", speculative=speculative)
        return estimate(s, 256, 256, batch)["tpot_s"]

    gain_b256 = tpot(256, None) / tpot(256, cfg)
    assert tpot(1, None) / tpot(1, cfg) > gain_b256
    assert gain_b256 < 1.5


def test_speculative_config_is_validated():
    with pytest.raises(ValueError, match="method"):
        SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3, '
                                '"acceptance_rate": 0.5}')
    with pytest.raises(ValueError, match="acceptance_rate"):
        SpeculativeConfig.parse('{"method": "eagle", "num_speculative_tokens": 3}')
    with pytest.raises(ValueError, match="unknown"):
        SpeculativeConfig.parse({**SPEC, "draft_model_typo": 1})
    mtp = DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm",
                         speculative=SpeculativeConfig("mtp", 1, 0.8))
    assert estimate(mtp, 128, 16)["fits"] is False  # Llama has no MTP layer
    dsv3 = DeploymentSpec("deepseek-v3", "fp8", "h200-sxm", "vllm", count=8, ep=8,
                          speculative=SpeculativeConfig("mtp", 1, 0.8))
    assert estimate(dsv3, 128, 16)["fits"] is True


def test_drafts_stop_at_the_context_limit():
    """No lookahead slot past max_model_len: a request that ends at the limit still finishes
    with the tokens a run without speculation gives."""
    opts = dict(BASE, max_model_len=128)
    plain, _, _ = run(EngineOptions(**opts), n=2, max_tokens=200, ignore_eos=True)
    spec, core, _ = run(EngineOptions(**opts, speculative_config=json.dumps(SPEC)), n=2,
                        max_tokens=200, ignore_eos=True)
    assert spec == plain and core.stats.spec_num_drafts > 0
    assert all(40 + 13 * i + len(spec[f"r{i}"]) == 128 for i in range(2))
