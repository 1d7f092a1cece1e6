"""The radix cache's invariants, checked after every step in tests (mini-sglang's
`check_integrity`), apart from the tree's operations so that `radix_cache.py` stays the tree.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .radix_cache import RadixCache
    from .radix_node import RadixNode


def iter_nodes(cache: RadixCache) -> Iterator[RadixNode]:
    """Every node of every adapter's tree, roots included."""
    stack = list(cache.roots.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def check_radix(cache: RadixCache) -> None:
    """Raise AssertionError unless: keys cover whole blocks, parent/child links agree, lock
    counts are ≥ 0 and a node's count ≥ the sum of its children's, no block is in two
    nodes, every cached block is used in the pool (tree ⊆ pool), an unlocked node's blocks
    are held by the tree alone, the evictable/cached/node counters match the tree, and
    every unlocked leaf is queued for eviction with its current LRU time."""
    bs = cache.block_size
    seen: set[int] = set()
    evictable = 0
    for node in iter_nodes(cache):
        if node.lock_ref < 0:
            raise AssertionError(f"{node} has a negative lock count")
        child_locks = 0
        for first, child in node.children.items():
            if child.parent is not node or child.key[:bs] != first:
                raise AssertionError(f"{child} is linked wrongly under {node}")
            child_locks += child.lock_ref
        if node.parent is None:
            continue
        if child_locks > node.lock_ref:
            raise AssertionError(f"{node} has fewer locks than its children")
        if not node.block_ids or len(node.key) < len(node.block_ids) * bs:
            raise AssertionError(f"{node} key does not cover its blocks")
        for b in node.block_ids:
            if b in seen:
                raise AssertionError(f"block {b} owned by two nodes")
            seen.add(b)
            refs = cache.pool.ref_count(b)
            if refs < 1:
                raise AssertionError(f"cached block {b} is free in the pool")
            if node.lock_ref == 0 and refs != 1:
                raise AssertionError(f"unlocked cached block {b} has {refs} holders")
        if node.lock_ref == 0:
            evictable += len(node.block_ids)
        if cache.events is not None and len(node.hashes) != len(node.block_ids):
            raise AssertionError(f"{node} has {len(node.hashes)} hashes for "
                                 f"{len(node.block_ids)} blocks")
    nodes = [n for n in iter_nodes(cache) if n.parent is not None]
    if len(nodes) != cache._num_nodes:
        raise AssertionError(f"node count drifted: {cache._num_nodes} vs {len(nodes)}")
    queued = {e[2].id for e in cache._heap if cache._valid(e)}
    for n in nodes:
        if not n.children and n.lock_ref == 0 and n.id not in queued:
            raise AssertionError(f"evictable leaf {n} is missing from the LRU heap")
    if evictable != cache._evictable or len(seen) != cache._cached:
        raise AssertionError(
            f"counters drifted: evictable {cache._evictable} vs {evictable}, "
            f"cached {cache._cached} vs {len(seen)}"
        )
