"""The radix cache's one-walk request paths agree exactly with the general operations they
replace: `insert_from` is `insert` + `lock(node)` + `unlock(start)`, `touch_unlock` is `touch` +
`unlock`, and eviction's in-place trim leaves a node whose dead key tail is never matched."""

from __future__ import annotations

import random

import pytest

from server.engine.block_pool import BlockPool
from server.engine.radix_cache import RadixCache, RadixNode

BS = 4


def snapshot(cache: RadixCache) -> list[tuple]:
    """Everything eviction order and matching depend on, node by node."""
    out = []
    stack: list[tuple[RadixNode, int]] = [(cache.root, -1)]
    while stack:
        node, parent_id = stack.pop()
        live = tuple(node.key[: len(node.block_ids) * BS])
        out.append((node.id, parent_id, live, tuple(node.block_ids), node.lock_ref,
                    node.last_access))
        stack.extend((c, node.id) for c in node.children.values())
    out.sort()
    return [*out, (cache._clock, cache.evictable_blocks, cache.cached_blocks)]


class Caller:
    """A request's view: its tokens, its own blocks, its locked node and how far it is cached."""

    def __init__(self, pool: BlockPool, tokens: list[int]) -> None:
        self.tokens, self.blocks = tokens, pool.allocate(len(tokens) // BS)
        self.node: RadixNode | None = None
        self.known = 0


def adopt(pool: BlockPool, c: Caller, first: int, tree: list[int]) -> None:
    """The caller switches to the cache's copy of a block both computed (as cache_blocks)."""
    for i, b in enumerate(tree, first):
        if c.blocks[i] != b:
            pool.share((b,))
            pool.free((c.blocks[i],))
            c.blocks[i] = b


def reference_insert(cache: RadixCache, c: Caller, n: int) -> list[int]:
    node, tree = cache.insert(c.tokens[: n * BS], c.blocks[:n], start=(c.node, c.known))
    cache.lock(node)
    cache.unlock(c.node)
    adopt(cache.pool, c, c.known // BS, tree[c.known // BS :])
    c.node, c.known = node, n * BS
    return c.blocks


def fast_insert(cache: RadixCache, c: Caller, n: int) -> list[int]:
    node, theirs = cache.insert_from(c.node, c.known, c.tokens, c.blocks, n)
    adopt(cache.pool, c, c.known // BS, theirs)
    c.node, c.known = node, n * BS
    return c.blocks


@pytest.mark.parametrize("seed", range(6))
def test_insert_from_and_touch_unlock_match_the_general_operations(seed: int) -> None:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3) for _ in range(rng.randrange(1, 4) * BS)] for _ in range(3)]
    pools = [BlockPool(400, BS), BlockPool(400, BS)]
    caches = [RadixCache(p) for p in pools]
    live: list[tuple[Caller, Caller, int]] = []  # both callers, blocks still to cache
    for _ in range(60):
        op = rng.random()
        if op < 0.35 and pools[0].num_free >= 12:
            tokens = rng.choice(prefixes) + [rng.randrange(3) for _ in range(rng.randrange(12))]
            tokens = tokens[: len(tokens) // BS * BS] or [0] * BS
            live.append((Caller(pools[0], tokens), Caller(pools[1], tokens),
                         len(tokens) // BS))
        elif op < 0.7 and live:
            a, b, total = rng.choice(live)
            n = rng.randrange(a.known // BS + 1, total + 1) if a.known // BS < total else 0
            if n:
                assert fast_insert(caches[1], b, n) == reference_insert(caches[0], a, n)
        elif op < 0.85 and live:
            a, b, _ = live.pop(rng.randrange(len(live)))
            caches[0].touch(a.node)
            caches[0].unlock(a.node)
            caches[1].touch_unlock(b.node)
            pools[0].free(a.blocks)
            pools[1].free(b.blocks)
        else:
            k = rng.randrange(1, 6)
            assert caches[0].evict(k) == caches[1].evict(k)
        assert snapshot(caches[0]) == snapshot(caches[1])
        assert pools[0]._free == pools[1]._free and pools[0]._ref_counts == pools[1]._ref_counts
        for cache in caches:
            cache.check_integrity()
            cache.pool.check_integrity()


def test_insert_from_refuses_more_blocks_than_given() -> None:
    pool = BlockPool(8, BS)
    cache = RadixCache(pool)
    with pytest.raises(ValueError):
        cache.insert_from(None, 0, list(range(8)), pool.allocate(2), 3)


def test_a_trimmed_node_never_matches_its_evicted_tail() -> None:
    pool = BlockPool(8, BS)
    cache = RadixCache(pool)
    tokens = list(range(12))
    blocks = pool.allocate(3)
    cache.insert(tokens, blocks)
    pool.free(blocks)
    assert cache.evict(1) == 1  # trims the node's last block in place
    assert cache.match_prefix(tokens).num_tokens == 8
    assert cache.peek_prefix_len(tokens) == 8
    again = pool.allocate(3)
    node, tree = cache.insert(tokens, again)  # the third block comes back as a new child
    assert tree == [*blocks[:2], again[2]] and node.parent is not cache.root
    pool.free(again)
    cache.check_integrity()
    pool.check_integrity()


def test_free_sole_frees_in_order_and_refuses_a_shared_block() -> None:
    pool = BlockPool(4, BS)
    a = pool.allocate(3)
    pool.free_sole(a[1:])
    assert pool._free[-2:] == a[1:] and pool.num_free == 3
    pool.share(a[:1])
    with pytest.raises(AssertionError):
        pool.free_sole(a[:1])
