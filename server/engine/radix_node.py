"""A node of the radix prefix cache, and the block-wise match of a key against token ids.

Why its own module: the tree (`radix_cache.RadixCache`: lookup, split, insertion, invariants)
and its LRU side (`radix_lru.RadixLru`: locks, eviction candidates, eviction) both work on
these nodes; neither imports the other's half to reach them.
"""

from __future__ import annotations

from collections.abc import Sequence


class RadixNode:
    """One edge of the tree: a whole number of blocks of token ids (``key``) and the blocks
    holding their KV, its children keyed by their first block, its lock count (requests
    using it or a descendant) and LRU time. The roots (one per LoRA adapter) have no parent
    and are locked for good."""

    __slots__ = ("block_ids", "children", "hashes", "id", "key", "last_access", "lock_ref",
                 "parent")

    def __init__(
        self,
        key: tuple[int, ...],
        block_ids: list[int],
        parent: RadixNode | None,
        node_id: int,
        last_access: int = 0,
    ) -> None:
        # token ids: the node's are key[: len(block_ids) * block_size]. Eviction trims only
        # block_ids (copying a long key per trimmed block would cost more than the trim); the
        # dead tail beyond is never read.
        self.key = key
        self.block_ids = block_ids
        self.parent = parent
        self.children: dict[tuple[int, ...], RadixNode] = {}  # keyed by the child's first block
        self.lock_ref = 0
        self.last_access = last_access
        self.id = node_id
        # vLLM's block hashes, parallel to block_ids, with KV events on (a list then); without
        # them the shared empty tuple, so a node costs no list of its own
        self.hashes: list[bytes] | tuple[()] = ()

    def __repr__(self) -> str:
        return f"RadixNode(id={self.id}, blocks={len(self.block_ids)}, lock={self.lock_ref})"


def matched_len(child: RadixNode, token_ids: Sequence[int], pos: int, end: int,
                bs: int) -> tuple[int, int]:
    """How many tokens of `child`'s key (its first block already matched) equal `token_ids`
    from `pos`, in whole blocks, before `end`; and the key's length in tokens."""
    key, i, klen = child.key, bs, len(child.block_ids) * bs
    while i < klen and pos + i < end and _eq(key, i, token_ids, pos + i, bs):
        i += bs
    return i, klen


def _eq(key: tuple[int, ...], i: int, tokens: Sequence[int], j: int, n: int) -> bool:
    """key[i:i+n] == tokens[j:j+n] without building two slices."""
    return key[i : i + n] == tuple(tokens[j : j + n])
