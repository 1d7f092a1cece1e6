"""A generative checkpoint served by the pooling runner (vLLM's `--convert`): the placement
holds and runs the model without its LM head, so an untied head's weights leave memory and a
step's FLOPs, and a tied one (the embedding matrix stays) changes nothing resident."""

from __future__ import annotations

import dataclasses

import pytest

from devices import BatchShape, DeploymentSpec, place
from devices.cost import step_cost
from devices.placement import served_model

PUBLISHED = DeploymentSpec("qwen3-reranker-8b", "bf16", "h100-sxm", "vllm")
CROSS = dataclasses.replace(PUBLISHED, convert="classify", num_labels=1)


def resident(spec: DeploymentSpec) -> float:
    return sum(b for _, b in place(spec).weight_bytes)


def test_the_served_model_is_the_converted_one():
    model = served_model(CROSS)
    assert (model.pooling_task, model.num_labels, model.lm_head) == ("classify", 1, False)
    assert served_model(PUBLISHED).lm_head and not served_model(PUBLISHED).is_pooling
    assert served_model(dataclasses.replace(PUBLISHED, convert="embed")).num_labels == 0
    assert place(CROSS).model == model


def test_an_untied_head_leaves_memory_and_the_step():
    head = served_model(PUBLISHED).vocab * served_model(PUBLISHED).hidden
    assert resident(PUBLISHED) - resident(CROSS) == pytest.approx(2 * head, rel=1e-6)  # bf16
    shape = BatchShape(prefill=((512, 0),), decode=())
    published, cross = (step_cost(place(s), shape) for s in (PUBLISHED, CROSS))
    assert cross.flops < published.flops


def test_a_tied_head_keeps_its_embedding():
    tied = dataclasses.replace(PUBLISHED, model="qwen3-reranker-0.6b")
    assert resident(dataclasses.replace(tied, convert="classify", num_labels=1)) == \
        pytest.approx(resident(tied), rel=1e-9)
