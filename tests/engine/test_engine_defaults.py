"""The sequence cap a deployment gets without flags is its engine's: vLLM 0.33.0's by GPU
memory (1,024 on an H100, 256 on an A100 by device name), SGLang 0.5.23's derived from the KV
pool it was given (``KvSeqs``: pool tokens / context × 512 within 2,048..4,096, at most half
the pool), TensorRT-LLM's build limit; a flag always wins. The KV block size is vLLM 0.34.0's
64 tokens where CUDA's attention backends take it, 16 on ROCm (its ``ROCM_ATTN`` backend's
preference), and prefix-cache hits come in those blocks; TensorRT-LLM's is 32 tokens;
``--block-size`` wins."""

from __future__ import annotations

import pytest
from engine_drive import request

from devices import catalog
from devices.specs import KvSeqs
from server.engine.build import build_core
from server.engine.options import EngineOptions


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


def _cached_after_a_shared_prefix(chip: str, prefix: int = 150, **kw) -> tuple[int, int]:
    """(block size, tokens of the second prompt served from the prefix cache) when two prompts
    share ``prefix`` leading tokens and run one after the other on a vLLM deployment."""
    core = build_core(EngineOptions(name="d", model="llama-3.1-8b", quant="bf16", chip=chip,
                                    engine="vllm", **kw))
    shared, t = list(range(100, 100 + prefix)), 0.0
    second = None
    for i in range(2):
        core.add_request(second := request(f"r{i}", shared + [5000 + i] * 10, 4,
                                           ignore_eos=True))
        while core.has_unfinished():
            result = core.step(t)
            assert result is not None
            t += result.seconds
            core.scheduler.check_integrity()
    return core.scheduler.config.block_size, second.num_cached_tokens


# vLLM 0.34.0: CacheConfig.DEFAULT_BLOCK_SIZE = 64 (vllm/config/cache.py), kept by CUDA's
# FlashAttention and FlashInfer; ROCm's first backend, ROCM_ATTN, prefers 16
# (vllm/v1/attention/backends/rocm_attn.py). 150 shared tokens: 2 whole blocks of 64, 9 of 16.
@pytest.mark.parametrize(("chip", "flags", "block", "cached"), [
    ("h100-sxm", {}, 64, 128), ("b200", {}, 64, 128), ("mi300x", {}, 16, 144),
    ("h100-sxm", {"block_size": 16}, 16, 144), ("mi300x", {"block_size": 32}, 32, 128)])
def test_vllms_kv_block_is_its_releases_and_prefix_hits_come_in_it(chip, flags, block, cached):
    assert _cached_after_a_shared_prefix(chip, **flags) == (block, cached)


# ROCm's 16 is ROCM_ATTN's, its first backend for standard attention: latent attention goes
# to TRITON_MLA, and a pod with a KV connector skips ROCM_ATTN for TRITON_ATTN; both keep 64
# (vllm/platforms/rocm.py _get_backend_priorities)
@pytest.mark.parametrize(("options", "block"), [
    (dict(model="deepseek-v3", quant="fp8", chip="mi300x", count=8), 64),
    (dict(model="llama-3.1-8b", quant="bf16", chip="mi300x", kv_offloading_size=1.0), 64),
    (dict(model="llama-3.1-8b", quant="bf16", chip="mi300x",
          kv_transfer_config='{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'), 64),
    (dict(model="llama-3.1-8b", quant="bf16", chip="mi300x"), 16)])
def test_rocms_16_is_for_standard_attention_without_a_connector(options, block):
    core = build_core(EngineOptions(name="d", engine="vllm", **options))
    assert core.scheduler.config.block_size == block


# TensorRT-LLM: KvCacheConfig.tokens_per_block = 32 (tensorrt_llm/llmapi/llm_args.py); SGLang's
# page is 16 here (its own default is 1 token: docs/SGLANG_SERVE.md)
@pytest.mark.parametrize(("engine", "block"), [("tensorrt-llm", 32), ("sglang", 16)])
def test_other_engines_take_their_own_block_size(engine, block):
    core = build_core(EngineOptions(name="d", model="llama-3.1-8b", quant="bf16",
                                    chip="h100-sxm", engine=engine))
    assert core.scheduler.config.block_size == block


@pytest.mark.parametrize(("options", "block"), [
    (dict(model="deepseek-v3", quant="fp8", chip="mi300x"), 64),
    (dict(model="llama-3.1-8b", quant="bf16", chip="mi300x"), 16),
    (dict(model="llama-3.1-8b", quant="bf16", chip="mi300x", block_size=32), 32),
    (dict(model="llama-3.1-8b", quant="bf16", chip="no-such-chip"), 16)])
def test_a_deployment_that_failed_to_place_reports_the_block_it_would_have_had(options, block):
    from server.engine_proc.info import failed_info

    info = failed_info(EngineOptions(name="d", engine="vllm", **options), 0, "why", 1000)
    assert info.capacity.block_size == block
