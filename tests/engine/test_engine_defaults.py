"""The sequence cap a deployment gets without flags is its engine's: vLLM 0.33.0's by GPU
memory (1,024 on an H100, 256 on an A100 by device name), SGLang 0.5.23's derived from the KV
pool it was given (``KvSeqs``: pool tokens / context × 512 within 2,048..4,096, at most half
the pool), TensorRT-LLM's build limit; a flag always wins."""

from __future__ import annotations

import pytest

from devices import catalog
from devices.specs import KvSeqs
from server.engine.build import EngineOptions, build_core


def _seqs(engine: str, chip: str = "h100-sxm", model: str = "llama-3.1-8b", **kw) -> int:
    core = build_core(EngineOptions(name="d", model=model, quant="bf16", chip=chip,
                                    engine=engine, **kw))
    return core.scheduler.config.max_num_seqs


def _pool(engine: str, chip: str, model: str, **kw) -> int:
    return build_core(EngineOptions(name="d", model=model, quant="bf16", chip=chip,
                                    engine=engine, **kw)).placement.kv_tokens


@pytest.mark.parametrize(("chip", "seqs"), [("h100-sxm", 1024), ("a100-sxm-80g", 256),
                                            ("rtx-4090", 256), ("b200", 1024)])
def test_vllm_caps_sequences_by_gpu_memory(chip, seqs):
    assert _seqs("vllm", chip) == seqs


def test_sglang_derives_its_cap_from_the_kv_pool():
    # Llama 3.1 8B (128k context) on an H100: ~420k tokens / 128k × 512 < 2048 → the floor
    assert _pool("sglang", "h100-sxm", "llama-3.1-8b") / 131072 * 512 < 2048
    assert _seqs("sglang") == 2048
    # a 4k-context model: the same pool gives far more than 4096 → the ceiling
    assert _pool("sglang", "h100-sxm", "llama-2-7b") / 4096 * 512 > 4096
    assert _seqs("sglang", model="llama-2-7b") == 4096
    # in between: the pool's own estimate (an H200's larger pool)
    pool = _pool("sglang", "h200-sxm", "llama-3.1-8b")
    between = _seqs("sglang", "h200-sxm")
    assert 2048 < between < 4096 and between == int(pool / 131072 * 512)


def test_sglangs_cap_is_at_most_half_a_small_pool():
    rule = catalog.get_engine("sglang").scheduler.kv_seqs
    assert rule == KvSeqs(per_context=512, low=2048, high=4096, share=0.5)
    assert rule.seqs(3000, 131072) == 1500 and rule.seqs(10_000, 131072) == 2048


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_flag_wins(engine):
    assert _seqs(engine, max_num_seqs=7) == 7
