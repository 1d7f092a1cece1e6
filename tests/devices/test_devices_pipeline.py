"""Pipelines: latency sums the stages, throughput is set by the slowest stage × micro-batches."""

from __future__ import annotations

import pytest

from devices import BatchShape, DeploymentSpec, place, step_cost
from devices.pipeline import cycle_cost, micro_batch, num_stages


def test_without_pipeline_a_cycle_is_one_step():
    h100 = place(DeploymentSpec("llama-3.1-8b", "bf16", "h100-sxm", "vllm"))
    batch = BatchShape(prefill=((100, 0),), decode=(500,) * 31)
    cycle, step = cycle_cost(h100, batch), step_cost(h100, batch)
    assert num_stages(h100) == 1
    assert (cycle.seconds, cycle.micro_batches, cycle.joules) == (step.seconds, 1, step.joules)


def test_groq_micro_batches_fill_the_pipeline():
    groq = place(DeploymentSpec("llama-2-70b", "f16", "groq-lpu-v1", "groq"))
    stages = num_stages(groq)
    # hundreds of chips, but the pipeline is as deep as the model has layers: several chips
    # work on each layer together
    assert groq.chips > 300 and stages == groq.model.n_layers == 80
    one = cycle_cost(groq, BatchShape(decode=(1000,)))
    many = cycle_cost(groq, BatchShape(decode=(1000,) * 16))
    assert many.micro_batches == 16 and many.micro.tokens == 1
    # 16 micro-batches in flight over 80 stages: each sequence still waits one
    # latency, so 16 users get 16 tokens in about the time one user gets one
    assert many.seconds == pytest.approx(one.seconds, rel=0.01)
    assert many.seconds == max(many.micro.seconds, 16 * many.micro.interval_s)
    # summing every micro-batch's full latency instead would be off by the micro-batch count
    assert 16 * one.seconds > 15 * many.seconds


def test_more_micro_batches_than_the_slowest_stage_allows_are_throughput_bound():
    groq = place(DeploymentSpec("llama-2-70b", "f16", "groq-lpu-v1", "groq"))
    full = cycle_cost(groq, BatchShape(decode=(1000,) * 4096))
    assert full.micro_batches == num_stages(groq)
    assert full.seconds == pytest.approx(full.micro_batches * full.micro.interval_s)
    assert full.seconds > full.micro.seconds


def test_micro_batches_deal_sequences_round_robin():
    batch = BatchShape(prefill=((10, 0), (20, 0)), decode=(1, 2, 3, 4, 5))
    first = micro_batch(batch, 3)
    assert first.prefill == ((10, 0),) and first.decode == (2, 5)
