"""An embedding model in virtual time (`simulate --model qwen3-embedding-8b`): every request
ends with its prefill and generates nothing, so its TTFT is its end-to-end latency (the vector
is its one output, as vLLM's metrics record it); the run is the same macro-stepped or not; the
summary prices the run per million input tokens; a prompt may fill the context."""

from __future__ import annotations

import dataclasses

import pytest

from clients.workloads import WorkloadSpec
from server.engine.options import EngineOptions
from sim.simulation import simulate_conversations

EMBED = EngineOptions(name="e", model="qwen3-embedding-8b", quant="bf16", chip="h100-sxm",
                      engine="vllm")
LOAD = WorkloadSpec(kind="random", num_requests=300, rate=40.0, isl=400, osl=64, seed=3)


def test_every_request_is_its_prefill_and_nothing_more():
    summary, records = simulate_conversations(EMBED, LOAD)
    assert len(records) == 300 and all(r.ok for r in records)
    assert all(r.output_tokens == 0 and r.finish_reason == "stop" for r in records)
    assert all(r.ttft == pytest.approx(r.e2e) and r.ttft > 0 for r in records)
    assert summary["output_tokens"] == 0
    assert summary["prefill_tokens"] == summary["prompt_tokens"] - summary["cached_prompt_tokens"]
    p = summary["pooling"]
    assert p["usd_per_m_input_tok"] > 0 and p["joules_per_m_input_tok"] > 0


def test_a_heavier_load_queues_and_macro_stepping_changes_nothing():
    light, _ = simulate_conversations(EMBED, dataclasses.replace(LOAD, rate=10.0))
    heavy, _ = simulate_conversations(EMBED, dataclasses.replace(LOAD, rate=400.0))
    assert heavy["ttft_s"]["p50"] > 2 * light["ttft_s"]["p50"]  # the prefill queue builds
    # priced per input token: a busier chip spreads its price over more of them
    assert heavy["pooling"]["usd_per_m_input_tok"] < light["pooling"]["usd_per_m_input_tok"] / 4
    single, recs1 = simulate_conversations(EMBED, LOAD, macro_steps=False)
    macro, recs2 = simulate_conversations(EMBED, LOAD, macro_steps=True)
    assert [(r.request_id, r.token_times, r.end_s) for r in recs1] == \
        [(r.request_id, r.token_times, r.end_s) for r in recs2]
    assert single == macro


def test_a_prompt_may_fill_the_context():
    full = dataclasses.replace(EMBED, max_model_len=400)
    _, records = simulate_conversations(full, dataclasses.replace(LOAD, num_requests=20))
    assert all(r.ok and r.prompt_tokens <= 400 for r in records)
    assert max(r.prompt_tokens for r in records) == 400  # (a generation of 64 would not fit)


def last_json(capsys) -> dict:
    import json

    return json.loads(capsys.readouterr().out.strip().split("\n")[-1])


def test_a_fleet_of_embedding_replicas_and_its_plan_are_priced_per_input_token(tmp_path,
                                                                               capsys):
    from doppelchip.cli import main

    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[deployments]]\nname = "e"\nmodel = "qwen3-embedding-8b"\n'
                     'quant = "bf16"\nchip = "h100-sxm"\nengine = "vllm"\nreplicas = 2\n')
    work = ["--workload", "random", "--isl", "400", "--osl", "8", "--num-requests", "200",
            "--rate", "60", "--seed", "1"]
    assert main(["simulate", "--config", str(fleet), "--router", "least-requests", *work,
                 "--json"]) == 0
    s = last_json(capsys)
    assert s["output_tokens"] == 0 and s["requests"] == 200
    assert [r["requests"] for r in s["replicas"]] != [200, 0]  # both replicas served
    assert s["pooling"]["usd_per_m_input_tok"] > 0
    argv = ["plan", "--model", "qwen3-embedding-8b", "--chips", "h100-sxm,rtx-4090",
            "--engines", "vllm", "--quants", "bf16", "--tp", "1", *work, "--slo", "ttft=0.5",
            "--jobs", "1"]
    assert main([*argv, "--json"]) == 0
    plan = last_json(capsys)
    assert plan["usd_per_m_input_tok"] > 0 and plan["usd_per_mtok"] == 0
    assert main(argv) == 0
    winner = next(line for line in capsys.readouterr().out.splitlines()
                  if line.startswith("winner:"))
    assert f"${plan['usd_per_m_input_tok']:.3g} per million input tokens" in winner


def test_estimate_prices_an_embedding_model_as_the_saturated_engine_serves_it(capsys):
    from doppelchip.cli import main

    assert main(["estimate", "--chip", "h100-sxm", "--engine", "vllm", "--model",
                 "qwen3-embedding-8b", "--quant", "bf16", "--batch", "16", "--prompt", "512",
                 "--json"]) == 0
    point = last_json(capsys)
    assert any("a pooling model" in n for n in point["notes"])
    # 16 prompts of 512 tokens fill one step of vLLM's 8,192-token budget, as a saturated
    # engine's queue does: the analytic point and the scheduler agree
    burst = WorkloadSpec(kind="random", num_requests=1600, rate=1e6, isl=512, osl=1, seed=2)
    summary, _ = simulate_conversations(EMBED, burst)
    assert point["embeddings_per_s"] == pytest.approx(summary["requests_per_s"], rel=0.03)
    assert point["usd_per_m_input_tok"] > 0


RERANKER = EngineOptions(
    name="r", model="qwen3-reranker-8b", quant="bf16", chip="h100-sxm", engine="vllm",
    hf_overrides='{"architectures": ["Qwen3ForSequenceClassification"], '
                 '"classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true}')


def test_a_reranker_converted_by_its_overrides_pools_without_its_lm_head():
    as_published = dataclasses.replace(RERANKER, hf_overrides=None)
    gen, gen_records = simulate_conversations(as_published, LOAD)
    cross, records = simulate_conversations(RERANKER, LOAD)
    assert all(r.ok and r.output_tokens == 0 for r in records)
    assert all(r.output_tokens > 0 for r in gen_records)  # as published: a language model
    assert "pooling" in cross and "pooling" not in gen
    # the body alone: its prefill costs what the embedding model of the same shape costs
    # (their vocabularies differ by 4 rows, 16 K of 7.57 G parameters)
    embed, _ = simulate_conversations(EMBED, LOAD)
    assert cross["ttft_s"]["mean"] == pytest.approx(embed["ttft_s"]["mean"], rel=1e-3)
    assert cross["ttft_s"]["mean"] < gen["ttft_s"]["mean"]


def test_plan_sizes_a_reranker_fleet_that_keeps_its_conversion(tmp_path, capsys):
    from doppelchip.cli import main

    work = ["--workload", "random", "--isl", "400", "--osl", "8", "--num-requests", "200",
            "--rate", "60", "--seed", "1"]
    argv = ["plan", "--model", "qwen3-reranker-8b", "--hf-overrides", RERANKER.hf_overrides,
            "--chips", "rtx-4090", "--engines", "vllm", "--quants", "bf16", "--tp", "1", *work,
            "--slo", "ttft=0.5", "--jobs", "1", "--write-fleet", str(tmp_path / "w.toml")]
    assert main([*argv, "--json"]) == 0
    plan = last_json(capsys)
    assert plan["usd_per_m_input_tok"] > 0 and plan["usd_per_mtok"] == 0
    assert "hf_overrides = " in plan["fleet"]
    # the written fleet re-simulates as the cross-encoder it planned (nothing generated)
    assert main(["simulate", "--config", str(tmp_path / "w.toml"), *work, "--json"]) == 0
    again = last_json(capsys)
    assert again["output_tokens"] == 0 and again["pooling"]["usd_per_m_input_tok"] > 0


ENCODER = EngineOptions(name="b", model="bge-reranker-v2-m3", quant="f16", chip="h100-sxm",
                        engine="vllm")
SHARED = WorkloadSpec(kind="shared-prefix", num_requests=400, rate=400.0, isl=164, osl=8,
                      system_prompt_len=112, users_per_prefix=16, seed=5)


def test_an_encoder_computes_every_prompt_whole_and_its_lone_request_costs_one_step():
    from devices import BatchShape, step_cost
    from server.engine.build import build_core

    summary, records = simulate_conversations(ENCODER, SHARED)
    assert all(r.ok and r.output_tokens == 0 for r in records)
    assert summary["cached_prompt_tokens"] == 0  # no KV cache, no prefix cache
    assert summary["prefill_tokens"] == summary["prompt_tokens"]
    # a converted decoder of the same size reuses the shared prefix of the same workload (in
    # 16-token blocks all 112 tokens of it; a 64-token block, vLLM 0.34.0's, would keep 64)
    qwen = dataclasses.replace(RERANKER, model="qwen3-reranker-0.6b", block_size=16)
    decoder, _ = simulate_conversations(qwen, SHARED)
    assert decoder["cached_prompt_tokens"] > 0.3 * decoder["prompt_tokens"]
    # alone on the chip, a request's TTFT is one step of its whole prompt (bidirectional)
    lone = WorkloadSpec(kind="random", num_requests=1, rate=1.0, isl=3000, osl=8, seed=1)
    _, (rec,) = simulate_conversations(ENCODER, lone)
    placement = build_core(ENCODER).placement
    step = step_cost(placement, BatchShape(prefill=((rec.prompt_tokens, 0),))).seconds
    assert rec.ttft == pytest.approx(step, rel=1e-6)


def test_plan_keeps_the_pooler_config_and_its_fleet_caches_nothing(tmp_path, capsys):
    from doppelchip.cli import main

    work = ["--workload", "shared-prefix", "--system-prompt-len", "256", "--isl", "320",
            "--osl", "8", "--users-per-prefix", "8", "--num-requests", "200", "--rate", "50",
            "--seed", "1"]
    mean = '{"pooling_type": "MEAN"}'
    argv = ["plan", "--model", "qwen3-embedding-0.6b", "--pooler-config", mean,
            "--chips", "rtx-4090", "--engines", "vllm", "--quants", "bf16", "--tp", "1", *work,
            "--slo", "ttft=0.5", "--jobs", "1", "--write-fleet", str(tmp_path / "w.toml")]
    assert main([*argv, "--json"]) == 0
    assert "pooler_config = " in last_json(capsys)["fleet"]
    # re-simulated, the MEAN-pooled fleet computes every prompt whole; as published (LAST),
    # the same workload finds its shared prefix cached
    assert main(["simulate", "--config", str(tmp_path / "w.toml"), *work, "--json"]) == 0
    assert last_json(capsys)["cached_prompt_tokens"] == 0
    last = EngineOptions(name="e", model="qwen3-embedding-0.6b", quant="bf16", chip="rtx-4090",
                         engine="vllm")
    shared = WorkloadSpec(kind="shared-prefix", num_requests=200, rate=50.0, isl=320, osl=8,
                          system_prompt_len=256, users_per_prefix=8, seed=1)
    assert simulate_conversations(last, shared)[0]["cached_prompt_tokens"] > 0
