"""TensorRT-LLM's KV-cache block key ("v1_block_key"): the `block_hash` of its KV cache events
and what its `KvCacheAwareRouter` recomputes from a prompt to find the worker holding it.

The algorithm is TensorRT-LLM's C++ `BlockKeyHasher::hash(blockKey, parentHash)`
(`cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp`; TensorRT-LLM's Python port is
`tensorrt_llm/runtime/kv_cache_hash.py` `hash_v1_block_key`): a 64-bit seed starts as the
block's token count XOR the parent key times a constant (0 at the root); every token id is
mixed in by a 32-bit integer hash, then a LoRA task id, if the request has one, by a 64-bit
one. Here written with explicit masks for C++'s unsigned wrap-around; the expected values in
`tests/fixtures/trtllm_block_hashes.json` come from a C++ program
(`tests/fixtures/gen_trtllm_block_hashes.cpp`). Not here: extra token ids, multimodal keys
and the cache salt, which doppelchip's requests do not carry.
"""

from __future__ import annotations

from collections.abc import Sequence

HASH_ALGO = "v1_block_key"  # TensorRT-LLM's KV_CACHE_HASH_ALGO_V1, its default

_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1
_PARENT = 0xBF58476D1CE4E5B9
_MIX32 = 0x45D9F3B
_MIX64_A, _MIX64_B = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_GOLDEN = 0x9E3779B9


def _combine(value: int, seed: int) -> int:
    return seed ^ ((value + ((seed << 6) & _U64) + (seed >> 2)) & _U64)


def _mix32(token: int, seed: int) -> int:
    a = token & _U32
    a = (((a >> 16) ^ a) * _MIX32) & _U32
    a = (((a >> 16) ^ a) * _MIX32) & _U32
    a = (a >> 16) ^ a
    return _combine((a + _GOLDEN) & _U32, seed)  # uint32_t + unsigned: wraps at 32 bits


def _mix64(value: int, seed: int) -> int:
    c = value & _U64
    c = ((c ^ (c >> 30)) * _MIX64_A) & _U64
    c = ((c ^ (c >> 27)) * _MIX64_B) & _U64
    c ^= c >> 31
    return _combine((c + _GOLDEN) & _U64, seed)


def block_key(tokens: Sequence[int], parent: int = 0, lora_task_id: int | None = None) -> int:
    """The key of one block of `tokens` after the block keyed `parent` (0: the first block)."""
    seed = (len(tokens) ^ (parent * _PARENT)) & _U64
    for t in tokens:
        seed = _mix32(t, seed)
    if lora_task_id is not None:
        seed = _mix64(lora_task_id, seed)
    return seed


def chain(tokens: Sequence[int], block_size: int, parent: int = 0,
          lora_task_id: int | None = None) -> list[int]:
    """The keys of `tokens` cut into blocks of `block_size` (a short last block included),
    each block's parent the key before it."""
    out = []
    for start in range(0, len(tokens), block_size):
        parent = block_key(tokens[start:start + block_size], parent, lora_task_id)
        out.append(parent)
    return out
