"""Data-parallel ranks of a MoE model (vLLM's `--data-parallel-size` with a MoE checkpoint).

vLLM shards a MoE layer over every rank's chips (FusedMoEParallelConfig: TP × DP devices),
and the ranks step together. `place(spec, ranks=R)` is one rank's view of that group: the
rank's chips, weights and KV pool, and steps that cost the group's step with every rank
carrying a batch like its own. Dense models, and engines whose ranks are replicas (SGLang's
--dp-size), are independent copies.
"""

from __future__ import annotations

import dataclasses

import pytest

from devices import BatchShape, DeploymentSpec, PlacementError, place, step_cost
from devices.parallel import Parallelism
from server.engine.build import build_core
from server.engine.options import EngineOptions

MOE = DeploymentSpec(model="qwen3-30b-a3b", quant="bf16", chip="h100-sxm", engine="vllm")


def _group(spec: DeploymentSpec, ranks: int) -> DeploymentSpec:
    """The whole group as one placement: R attention replicas, experts over all R chips,
    R ranks' step budget (vLLM's 8192 tokens per rank on an H100)."""
    return dataclasses.replace(spec, count=ranks, tp=1, ep=ranks,
                               max_batched_tokens=8192 * ranks)


def test_a_rank_holds_its_share_of_the_experts_and_the_kv_that_frees():
    one, rank = place(MOE), place(MOE, ranks=4)
    group = place(_group(MOE, 4))
    assert rank.chips == 1 and rank.dp == 1 and rank.plan.ranks == 4
    assert dict(rank.weight_bytes)["hbm"] == pytest.approx(dict(group.weight_bytes)["hbm"] / 4)
    assert dict(rank.weight_bytes)["hbm"] < 0.5 * dict(one.weight_bytes)["hbm"]
    assert rank.kv_tokens == group.kv_tokens // 4
    assert rank.kv_tokens > 2 * one.kv_tokens  # the experts' memory went to the KV cache


def test_a_model_too_big_for_a_rank_is_served_by_the_group():
    big = DeploymentSpec(model="qwen3-235b-a22b", quant="bf16", chip="h100-sxm", engine="vllm")
    with pytest.raises(PlacementError, match="does not fit"):
        place(big)
    assert place(big, ranks=8).kv_tokens > 0


@pytest.mark.parametrize("batch", [
    BatchShape(decode=(700, 1500, 3)),
    BatchShape(prefill=((900, 0), (40, 2000)), decode=(100,) * 17),
], ids=["decode", "mixed"])
def test_a_rank_step_costs_the_group_step_of_every_rank_running_its_batch(batch):
    ranks = 4
    rank = place(MOE, ranks=ranks)
    group = place(_group(MOE, ranks))
    everyone = BatchShape(prefill=batch.prefill * ranks, decode=batch.decode * ranks)
    mine, whole = step_cost(rank, batch), step_cost(group, everyone)
    assert mine.seconds == pytest.approx(whole.seconds, rel=1e-12)
    assert mine.bound == whole.bound
    for name in ("flops", "joules", "dollars", "bytes"):
        assert getattr(mine, name) == pytest.approx(getattr(whole, name) / ranks, rel=1e-12)
    assert mine.tokens == batch.num_tokens


def test_a_rank_decodes_faster_than_a_full_copy_reading_only_its_share_of_the_experts():
    """Memory-bound decode: a rank reads a quarter of the experts (those every rank's tokens
    touch), plus the all-to-alls, against all of them for a full copy."""
    batch = BatchShape(decode=(1000,) * 32)
    rank = step_cost(place(MOE, ranks=4), batch).seconds
    copy = step_cost(place(MOE), batch).seconds
    assert rank < copy


@pytest.mark.parametrize("spec", [
    DeploymentSpec(model="llama-3.1-8b", quant="bf16", chip="h100-sxm", engine="vllm"),
    dataclasses.replace(MOE, engine="sglang"),
], ids=["dense", "sglang-replicas"])
def test_dense_models_and_replica_engines_place_each_rank_as_a_full_copy(spec):
    assert place(spec, ranks=4) == place(spec)
    assert place(spec, ranks=4).plan.ranks == 1


def test_an_idle_rank_draws_and_costs_its_own_chips_not_the_groups():
    rank = build_core(EngineOptions(name="a", model=MOE.model, quant=MOE.quant, chip=MOE.chip,
                                    engine=MOE.engine, data_parallel_size=4))
    copy = place(MOE)  # one chip too
    assert rank.idle_watts == pytest.approx(copy.plan.idle_w)
    assert rank.dollars_per_s == pytest.approx(copy.plan.usd_per_s)


def test_experts_that_the_ranks_do_not_divide_are_split_as_vllm_splits_them():
    """128 experts over 6 ranks: vLLM gives the first two 22, the others 21; the fullest
    chip (which every step waits for) holds 22."""
    par = Parallelism(tp=1, pp=1, dp=6, ep=6)
    assert par.experts_per_chip(128.0, 128) == 22.0
    assert Parallelism(tp=1, pp=1, dp=8, ep=8).experts_per_chip(128.0, 128) == 16.0
    six = place(MOE, ranks=6)
    assert place(MOE, ranks=4).kv_tokens < six.kv_tokens < place(MOE, ranks=8).kv_tokens


def test_estimate_of_a_rank_from_the_command_line(capsys):
    import json

    from doppelchip.cli import main

    argv = ["estimate", "--chip", MOE.chip, "--engine", MOE.engine, "--model", MOE.model,
            "--quant", MOE.quant, "--tp", "1", "--batch", "16", "--json"]
    assert main([*argv, "--data-parallel-size", "4"]) == 0
    rank = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    whole = json.loads(capsys.readouterr().out)
    assert rank["data_parallel_size"] == 4 and rank["chips"] == whole["chips"] == 1
    assert rank["kv_tokens"] > whole["kv_tokens"]  # a quarter of the experts on its chip
    assert rank["usd_per_hour"] == pytest.approx(whole["usd_per_hour"])  # its chip's price
    assert main([*argv, "-dp", "0"]) == 2
    assert "--data-parallel-size must be >= 1" in capsys.readouterr().out
