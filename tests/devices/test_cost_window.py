"""`decode_costs` (closed-form decode windows) gives `step_cost`'s floats for each step."""

from __future__ import annotations

import random

import numpy as np
import pytest

from devices import BatchShape
from devices.cost import step_cost
from devices.cost_window import BOUNDS, closed_form, decode_costs
from server.engine.build import build_core
from server.engine.options import EngineOptions

CASES = [
    EngineOptions(name="a", model="llama-2-7b", quant="bf16", chip="h100-sxm", engine="vllm"),
    EngineOptions(name="b", model="mixtral-8x7b", quant="fp8", chip="h100-sxm", engine="vllm",
                  tp=2),  # MoE: touched experts depend on the batch size; two chips
    EngineOptions(name="c", model="llama-3.1-70b", quant="bf16", chip="h100-sxm",
                  engine="sglang", tp=4),
    EngineOptions(name="d", model="qwen3-30b-a3b", quant="bf16", chip="h100-sxm",
                  engine="vllm", data_parallel_size=4),  # one rank of a DP+EP group
]


@pytest.mark.parametrize("options", CASES, ids=lambda o: f"{o.model}-dp{o.data_parallel_size}")
def test_decode_costs_are_step_cost_per_step(options):
    placement = build_core(options).placement
    assert closed_form(placement)
    rng = random.Random(1)
    batches = [tuple(rng.randrange(1, 6000) for _ in range(rng.choice((1, 3, 26, 300))))
               for _ in range(40)]
    costs = decode_costs(placement, np.array([len(b) for b in batches]),
                         np.array([sum(b) for b in batches]))
    for i, b in enumerate(batches):
        one = step_cost(placement, BatchShape(decode=b))
        assert costs.seconds[i] == one.seconds
        assert costs.joules[i] == one.joules and costs.dollars[i] == one.dollars
        assert costs.bytes[i] == one.bytes and costs.flops[i] == one.flops
        assert BOUNDS[costs.bound[i]] == one.bound
