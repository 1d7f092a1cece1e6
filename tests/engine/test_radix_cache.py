"""Radix prefix cache: block-aligned matches, node splits, locking, exact LRU eviction order."""

from __future__ import annotations

import pytest

from server.engine.block_pool import BlockPool
from server.engine.radix_cache import NoPrefixCache, RadixCache

BS = 4


def make(num_blocks: int = 32) -> tuple[BlockPool, RadixCache]:
    pool = BlockPool(num_blocks, BS)
    return pool, RadixCache(pool)


def cache_seq(pool: BlockPool, cache: RadixCache, tokens: list[int]) -> list[int]:
    """What a finishing request does: its blocks go into the tree, then it lets go of them."""
    blocks = pool.allocate(len(tokens) // BS)
    _, tree_blocks = cache.insert(tokens, blocks)
    pool.free(blocks)
    cache.check_integrity()
    pool.check_integrity()
    return tree_blocks


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_match_is_rounded_down_to_block_boundary() -> None:
    pool, cache = make()
    blocks = cache_seq(pool, cache, seq(1, 12))  # 3 blocks
    # 10 tokens in common (1..10), then a mismatch inside the third block: 8 usable.
    m = cache.match_prefix([*seq(1, 10), 99, 98, 97])
    assert (m.num_tokens, m.block_ids) == (8, blocks[:2])
    # A query shorter than the cached sequence and not block-aligned.
    assert cache.match_prefix(seq(1, 7)).num_tokens == 4
    assert cache.peek_prefix_len(seq(1, 7)) == 4
    # Mismatch inside the first block: nothing usable.
    assert cache.match_prefix([1, 2, 99, 4, 5, 6, 7, 8]).num_tokens == 0
    # A full match of all 3 blocks (plus an extra partial block in the query).
    m = cache.match_prefix(seq(1, 14))
    assert (m.num_tokens, m.block_ids) == (12, blocks)
    cache.check_integrity()


def test_partial_match_splits_the_node_and_insert_branches() -> None:
    pool, cache = make()
    a = cache_seq(pool, cache, seq(1, 12))
    assert len(cache.root.children) == 1
    (node,) = cache.root.children.values()
    assert len(node.key) == 12
    # Insert a sequence sharing 2 blocks and diverging mid third block.
    b_tokens = [*seq(1, 8), 9, 10, 55, 56, 57, 58, 59, 60]
    b_own = pool.allocate(4)
    leaf, tree_blocks = cache.insert(b_tokens, b_own)
    # The shared 2 blocks are the tree's (first inserter's); the rest are b's own.
    assert tree_blocks == [*a[:2], *b_own[2:]]
    (upper,) = cache.root.children.values()
    assert upper.key == tuple(seq(1, 8)) and upper.block_ids == a[:2]
    assert sorted(len(c.key) for c in upper.children.values()) == [4, 8]
    assert leaf is not None and leaf.parent is upper and leaf.key == tuple(b_tokens[8:])
    pool.free(b_own)  # b's duplicates of the shared blocks go back to the pool
    assert pool.num_used == 3 + 2
    cache.check_integrity()
    pool.check_integrity()
    assert cache.match_prefix(b_tokens).block_ids == tree_blocks


def test_match_splits_so_a_lock_covers_exactly_the_match() -> None:
    pool, cache = make()
    cache_seq(pool, cache, seq(1, 12))
    m = cache.match_prefix([*seq(1, 8), 0, 0, 0, 0])
    assert m.num_tokens == 8 and len(m.node.key) == 8
    cache.lock(m.node)
    assert cache.evictable_blocks == 1  # only the unmatched tail block
    assert cache.evict(10) == 1
    assert cache.match_prefix(seq(1, 12)).num_tokens == 8  # the locked part survived
    cache.unlock(m.node)
    assert cache.evictable_blocks == 2
    cache.check_integrity()


def test_locked_node_is_never_evicted() -> None:
    pool, cache = make()
    cache_seq(pool, cache, seq(1, 8))
    cache_seq(pool, cache, seq(100, 8))
    m = cache.match_prefix(seq(1, 8))
    cache.lock(m.node)
    pool.share(m.block_ids)  # the "request" holds the blocks too
    assert cache.evict(100) == 2
    assert cache.peek_prefix_len(seq(1, 8)) == 8
    assert cache.peek_prefix_len(seq(100, 8)) == 0
    cache.check_integrity()
    cache.unlock(m.node)
    pool.free(m.block_ids)
    assert cache.evict(100) == 2
    assert pool.num_free == pool.num_blocks
    cache.check_integrity()
    pool.check_integrity()


def test_exact_lru_eviction_order() -> None:
    pool, cache = make()
    a, b, c = seq(1, 8), seq(100, 8), seq(200, 8)
    for s in (a, b, c):
        cache_seq(pool, cache, s)
    cache.match_prefix(a)  # a becomes the most recently used
    # The least recently used is b: evicting 2 blocks removes b whole.
    assert cache.evict(2) == 2
    assert [cache.peek_prefix_len(s) for s in (a, b, c)] == [8, 0, 8]
    # One block more trims the tail of c (next LRU) and keeps its head.
    assert cache.evict(1) == 1
    assert [cache.peek_prefix_len(s) for s in (a, b, c)] == [8, 0, 4]
    assert cache.evict(1) == 1
    assert [cache.peek_prefix_len(s) for s in (a, b, c)] == [8, 0, 0]
    assert cache.evict(100) == 2
    assert cache.cached_blocks == 0 and pool.num_free == pool.num_blocks
    cache.check_integrity()


def test_eviction_cascades_up_to_parents_in_lru_order() -> None:
    pool, cache = make()
    p = seq(1, 4)
    x, y = [*p, 10, 11, 12, 13], [*p, 20, 21, 22, 23]
    bx = cache_seq(pool, cache, x)
    by = cache_seq(pool, cache, y)  # splits x's node: [p] -> {[x tail], [y tail]}
    assert bx[0] == by[0]
    freed_order = []
    for _ in range(3):
        before = set(range(pool.num_blocks)) - set(pool._free)
        assert cache.evict(1) == 1
        after = set(range(pool.num_blocks)) - set(pool._free)
        freed_order.append((before - after).pop())
        cache.check_integrity()
    # x's tail (oldest), then y's tail, then the parent p once it became a leaf.
    assert freed_order == [bx[1], by[1], bx[0]]
    # And in one call: the parent joins the candidates as soon as its children are gone.
    bx = cache_seq(pool, cache, x)
    cache_seq(pool, cache, y)
    assert cache.evict(3) == 3 and cache.cached_blocks == 0


def test_insert_requires_whole_blocks_and_empty_insert_is_noop() -> None:
    pool, cache = make()
    with pytest.raises(ValueError):
        cache.insert(seq(1, 6), pool.allocate(1))
    assert cache.insert([], []) == (None, [])


def test_no_prefix_cache_is_inert() -> None:
    pool = BlockPool(8, BS)
    cache = NoPrefixCache(pool)
    assert cache.match_prefix(seq(1, 8)).num_tokens == 0
    blocks = pool.allocate(2)
    assert cache.insert(seq(1, 8), blocks) == (None, blocks)
    assert cache.evict(5) == 0 and cache.evictable_blocks == 0
    pool.free(blocks)
    assert pool.num_free == 8
