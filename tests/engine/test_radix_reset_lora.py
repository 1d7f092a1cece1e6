"""reset() (vLLM's reset_prefix_cache) empties every adapter's tree, and refuses while a request
holds a node of any of them (LoRA, issue 13: one tree per adapter)."""

from __future__ import annotations

from server.engine.block_pool import BlockPool
from server.engine.radix_cache import RadixCache

BS = 4
TOKENS = list(range(100, 116))  # 4 whole blocks


def cached_under(lora: int) -> tuple[BlockPool, RadixCache]:
    pool = BlockPool(64, BS)
    cache = RadixCache(pool)
    blocks = pool.allocate(len(TOKENS) // BS)
    cache.insert(TOKENS, blocks, ns=lora)
    pool.free(blocks)  # the request finished: only the tree holds them
    return pool, cache


def test_reset_empties_an_adapters_tree_too() -> None:
    pool, cache = cached_under(lora=3)
    assert cache.reset()
    assert pool.num_free == pool.num_blocks and cache.cached_blocks == 0
    assert cache.match_prefix([*TOKENS, 1], ns=3).num_tokens == 0  # nothing freed is served
    cache.check_integrity()


def test_reset_is_refused_while_an_adapters_node_is_locked() -> None:
    pool, cache = cached_under(lora=3)
    match = cache.match_prefix([*TOKENS, 1], ns=3)
    cache.lock(match.node)  # a running request uses the cached blocks
    pool.share(match.block_ids)
    assert not cache.reset()
    assert cache.cached_blocks == len(TOKENS) // BS
    cache.check_integrity()
