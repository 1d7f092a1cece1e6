"""One source of truth for scheduler defaults: `estimate` and `simulate` chunk a prompt alike.

Both read the engine's `scheduler` table in devices/catalog/engines.toml (the budget of a step);
here the scheduler's actual prefill chunks are compared with the steps `estimate` prices.
"""

from __future__ import annotations

import pytest

from devices import catalog
from devices.estimate import prefill_steps
from server.engine.build import build_core
from server.engine.options import EngineOptions
from server.engine.request import Request, SamplingParams
from server.engine.scheduler_defaults import scheduler_config


def scheduled_chunks(opts: EngineOptions, prompt: int) -> list[tuple[tuple[int, int], ...]]:
    core = build_core(opts)
    core.add_request(Request("r", list(range(16, 16 + prompt)), SamplingParams(max_tokens=2)))
    chunks = []
    while (step := core.step()) is not None and step.output.prefill_segments:
        chunks.append(tuple(step.output.prefill_segments))
    return chunks


@pytest.mark.parametrize(
    ("opts", "prompt"),
    [
        (EngineOptions(name="cpp", model="llama-2-7b", quant="q4_0", chip="m2-ultra-60",
                       engine="llama.cpp"), 1500),
        (EngineOptions(name="vllm", model="llama-3.1-8b", quant="bf16", chip="rtx-4090",
                       engine="vllm", max_model_len=8192), 5000),
        (EngineOptions(name="js", model="llama-3.1-8b", quant="bf16", chip="tpu-v5e", count=8,
                       engine="jetstream", max_model_len=4096), 3000),
    ],
    ids=["llama.cpp", "vllm-small-gpu", "jetstream-unchunked"],
)
def test_estimate_and_simulate_chunk_a_prompt_alike(opts: EngineOptions, prompt: int):
    core = build_core(opts)
    expected = [s.prefill for s in prefill_steps(core.placement, prompt, 1)]
    assert scheduled_chunks(opts, prompt) == expected
    budget = scheduler_config(opts, core.placement).max_num_batched_tokens
    chip = catalog.get_chip(opts.chip)
    tokens = catalog.get_engine(opts.engine).scheduler.for_chip(chip.tier.capacity_bytes,
                                                               chip.name)[2]
    if tokens is None:  # unchunked: one step holds the whole prompt
        assert len(expected) == 1 and budget >= prompt
    else:
        assert budget == tokens and max(n for (n, _), in expected) == min(prompt, tokens)


def test_llamacpp_chunk_is_its_ubatch():
    """The catalogue's llama.cpp budget is n_ubatch 512: a 1500-token prompt is 3 steps."""
    opts = EngineOptions(name="cpp", model="llama-2-7b", quant="q4_0", chip="m2-ultra-60",
                         engine="llama.cpp")
    assert [n for ((n, _),) in scheduled_chunks(opts, 1500)] == [512, 512, 476]
