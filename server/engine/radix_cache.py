"""SGLang's radix tree over token ids: the prefix cache (contract in `prefix_cache.py`).

Ownership (why keys are whole blocks): a node's key is a whole number of blocks and each block
belongs to exactly one node, so splitting a node (on a partial match) never splits a block and
a block is never owned by two nodes. A partially filled last block of a request is never
inserted; it is freed with the request (the next request recomputes those < block_size tokens).
Every cached block carries exactly one pool reference for the tree; requests using it hold
their own. Hence an unlocked node's blocks have pool reference count exactly 1 (evicting them
really frees memory), which ``check_integrity`` verifies.

This module is the tree: lookup, node split, insertion and reset. Locks, LRU times and
eviction are its base `radix_lru.RadixLru`; the node is `radix_node.RadixNode`; the
invariants `radix_integrity.check_radix`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from .block_pool import BlockPool
from .kv_events import KvEventLog
from .prefix_cache import Namespace, NoPrefixCache, PrefixCache, PrefixMatch
from .radix_integrity import check_radix, iter_nodes
from .radix_lru import RadixLru
from .radix_node import RadixNode, matched_len

__all__ = ["NoPrefixCache", "PrefixCache", "PrefixMatch", "RadixCache", "RadixNode"]  # re-exported


class RadixCache(RadixLru, PrefixCache):
    """SGLang-style radix tree over token ids, with block-aligned keys (see module docstring);
    its locks, LRU order and eviction are `RadixLru`'s."""

    enabled = True

    def __init__(self, pool: BlockPool) -> None:
        super().__init__()  # the LRU side: clock, evictable count, candidate heap
        self.pool = pool
        self.block_size = pool.block_size
        self._ids = itertools.count()
        self.root = RadixNode((), [], None, next(self._ids))
        self.root.lock_ref = 1  # the root is never evicted
        # --- LoRA (issue 13): one tree per adapter (0: the base model), so two adapters never
        # share a block and one adapter shares its own, as vLLM's block hashes keyed by the
        # LoRA name (extra_keys) do
        # and one per cache salt (vLLM's cache_salt: a salted request shares blocks only with
        # requests of the same salt); empty namespaces are dropped as more are made (_root)
        self.roots: dict[Namespace, RadixNode] = {0: self.root}
        self._roots_cap = 64
        self._cached = 0
        self._num_nodes = 0
        self.events: KvEventLog | None = None  # KV events (issue 13): see attach_events

    # --- KV events (issue 13) ---
    def attach_events(self, log: KvEventLog) -> None:
        """Report every store, eviction and reset to ``log`` from now on, with vLLM's block
        hashes (kept per node, so an evicted block is named without rehashing its path)."""
        if self._cached:
            raise ValueError("attach KV events before anything is cached")
        self.events = log

    def reset(self) -> bool:
        """Empty the cache, as vLLM's ``reset_prefix_cache``: refused (False) while any request
        holds a block; on success the log gets one ``AllBlocksCleared``, no per-block removal,
        and the pool's residency metrics start afresh."""
        pool, roots = self.pool, self.roots.values()  # every adapter's tree (LoRA)
        if pool.num_free + self._cached != pool.num_blocks or any(
                c.lock_ref for root in roots for c in root.children.values()):
            return False
        for node in iter_nodes(self):
            if node.parent is not None:
                pool.free(node.block_ids)
        for root in roots:
            root.children.clear()
        self._heap.clear()
        self._evictable = self._cached = self._num_nodes = 0
        if self.events is not None:
            self.events.cleared()
        if pool.metrics is not None:  # vLLM's --kv-cache-metrics forget the sampled blocks
            pool.metrics.reset()
        return True
    # --- end KV events ---

    # -- lookup ----------------------------------------------------------------------------
    def _root(self, ns: Namespace, create: bool) -> RadixNode | None:
        root = self.roots.get(ns)
        if root is None and create:
            if len(self.roots) >= self._roots_cap:  # amortised: a sweep per doubling
                self._drop_empty_roots()
            root = self.roots[ns] = RadixNode((), [], None, next(self._ids))
            root.lock_ref = 1
        return root

    def _drop_empty_roots(self) -> None:
        """Forget the namespaces with nothing cached and no request on their root (a salt
        used once), so that distinct salts do not grow the tree's roots without bound."""
        for ns in [ns for ns, r in self.roots.items()
                   if ns != 0 and not r.children and r.lock_ref == 1]:
            del self.roots[ns]
        self._roots_cap = max(64, 2 * len(self.roots))

    def _walk(
        self,
        token_ids: Sequence[int],
        *,
        touch: bool,
        split: bool,
        start: tuple[RadixNode, int] | None = None,
        ns: Namespace = 0,
        limit: int | None = None,
    ) -> tuple[RadixNode, int]:
        """Follow ``token_ids`` (its first ``limit`` if given) whole block by whole block (from
        ``start`` if given, else the root); returns the deepest node reached and the number
        of tokens matched. With ``split``, a match ending inside a node splits it so the
        returned node ends exactly at the match."""
        bs = self.block_size
        n = len(token_ids) if limit is None else limit
        n -= n % bs
        if start is not None and start[0] is not None:
            node, pos = start
        else:
            root = self._root(ns, create=split)
            if root is None:
                return self.root, 0  # nothing cached for this adapter
            node, pos = root, 0
        now = self._tick() if touch else 0
        while pos < n:
            child = node.children.get(tuple(token_ids[pos : pos + bs]))
            if child is None:
                break
            i, klen = matched_len(child, token_ids, pos, n, bs)
            if i < klen:
                if not split:
                    return node, pos + i
                child = self._split(child, i)  # only the matched upper part is touched
            if touch:
                child.last_access = now
                self._candidate(child)
            node, pos = child, pos + i
            if i < klen:
                break
        return node, pos

    def match_prefix(self, token_ids: Sequence[int], ns: Namespace = 0, *,
                     num_tokens: int | None = None) -> PrefixMatch:
        node, num_tokens = self._walk(token_ids, touch=True, split=True, ns=ns,
                                      limit=num_tokens)
        if num_tokens == 0:
            return PrefixMatch(0, [], None)
        return PrefixMatch(num_tokens, self.path_blocks(node), node)

    def peek_prefix_len(self, token_ids: Sequence[int], ns: Namespace = 0) -> int:
        return self._walk(token_ids, touch=False, split=False, ns=ns)[1]

    def path_blocks(self, node: RadixNode) -> list[int]:
        return _along(node, "block_ids")

    def report_reused(self, node: RadixNode, token_ids: Sequence[int], ns: Namespace,
                      session_id: str | None) -> None:
        """KV events: the cached prefix ending at ``node`` (a match of ``token_ids``) was found
        by a request that asked to hear of it (vLLM's ``kv_cache_report_mode: "full"``)."""
        if self.events is None:
            return
        hashes = _along(node, "hashes")
        self.events.reused(hashes, token_ids[:len(hashes) * self.block_size], ns, session_id)

    def _split(self, child: RadixNode, i: int) -> RadixNode:
        """Cut ``child`` after its first ``i`` tokens (a block multiple); returns the new upper
        node, which inherits the lock count (every lock through ``child`` passes through it)."""
        bs = self.block_size
        parent = child.parent
        assert parent is not None and 0 < i < len(child.block_ids) * bs and i % bs == 0
        upper = RadixNode(child.key[:i], child.block_ids[: i // bs], parent, next(self._ids))
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        if child.hashes:
            upper.hashes, child.hashes = child.hashes[: i // bs], child.hashes[i // bs :]
        self._num_nodes += 1
        parent.children[child.key[:bs]] = upper
        child.key = child.key[i:]
        child.block_ids = child.block_ids[i // bs :]
        child.parent = upper
        upper.children[child.key[:bs]] = child
        return upper

    # -- insertion -------------------------------------------------------------------------
    def insert(
        self,
        token_ids: Sequence[int],
        block_ids: Sequence[int],
        start: tuple[RadixNode | None, int] | None = None,
        ns: Namespace = 0,
        session_id: str | None = None,
    ) -> tuple[RadixNode | None, list[int]]:
        bs = self.block_size
        if len(token_ids) != len(block_ids) * bs:
            raise ValueError(f"{len(token_ids)} tokens do not fill {len(block_ids)} blocks")
        node, pos = self._walk(token_ids, touch=True, split=True, start=start,  # type: ignore[arg-type]
                               ns=ns)
        tree_blocks = self.path_blocks(node) if pos else []
        if pos < len(token_ids):
            new_blocks = list(block_ids[pos // bs :])
            self.pool.share(new_blocks)
            key = tuple(token_ids[pos:])
            leaf = RadixNode(key, new_blocks, node, next(self._ids), self._clock)
            if self.events is not None:
                parent = node.hashes[-1] if node.hashes else None
                leaf.hashes = self.events.hashes(parent, key, ns)
                self.events.stored(parent, leaf.hashes, key, ns, session_id=session_id)
            node.children[key[:bs]] = leaf
            self._evictable += len(new_blocks)
            self._cached += len(new_blocks)
            self._num_nodes += 1
            self._candidate(leaf)
            tree_blocks.extend(new_blocks)
            node = leaf
        return (node if node.parent is not None else None), tree_blocks

    def insert_from(
        self,
        start: RadixNode | None,
        num_known: int,
        token_ids: Sequence[int],
        block_ids: list[int],
        num_blocks: int,
        ns: Namespace = 0,
        session_id: str | None = None,
    ) -> tuple[RadixNode, list[int]]:
        """What a request's ``insert`` + ``lock(node)`` + ``unlock(start)`` does, in one walk
        and without the caller slicing its token and block lists: store the first
        ``num_blocks`` blocks of ``token_ids``/``block_ids``, the caller's locked node
        ``start`` ending at token ``num_known`` of them (None, 0: nothing locked yet).
        Returns the node ending at the prefix (now locked by the caller instead of ``start``)
        and the blocks the tree held already for blocks ``num_known // bs`` onwards (the
        walked part; the caller adopts those, the rest are its own). Exactly the original's
        clock tick, splits, node ids and LRU times; it queues no eviction candidate because
        every node it reaches ends up locked."""
        bs = self.block_size
        end = num_blocks * bs
        if num_blocks > len(block_ids) or end > len(token_ids):
            raise ValueError(f"{num_blocks} blocks exceed {len(block_ids)} blocks or "
                             f"{len(token_ids)} tokens")
        if start is None:
            root = self._root(ns, create=True)
            assert root is not None
            start, num_known = root, 0
        self._clock += 1
        now = self._clock
        node, pos = start, num_known
        theirs: list[int] = []
        while pos < end and node.children:
            child = node.children.get(tuple(token_ids[pos : pos + bs]))
            if child is None:
                break
            i, klen = matched_len(child, token_ids, pos, end, bs)
            if i < klen:
                child = self._split(child, i)
            child.last_access = now
            theirs.extend(child.block_ids)
            node, pos = child, pos + i
            if i < klen:
                break
        if pos < end:
            new_blocks = block_ids[pos // bs : num_blocks]  # a new list: block_ids is one
            self.pool.share(new_blocks)
            key = tuple(token_ids[pos:end])
            leaf = RadixNode(key, new_blocks, node, next(self._ids), now)
            if self.events is not None:
                parent_hash = node.hashes[-1] if node.hashes else None
                leaf.hashes = self.events.hashes(parent_hash, key, ns)
                self.events.stored(parent_hash, leaf.hashes, key, ns, session_id=session_id)
            node.children[key[:bs]] = leaf
            leaf.lock_ref = 1  # the caller's lock (never counted evictable)
            self._cached += len(new_blocks)
            self._num_nodes += 1
            up = node
            node = leaf
        else:
            up = node
        while up is not start:  # the caller's lock moves down: only the walked nodes gain one
            if up.lock_ref == 0:
                self._evictable -= len(up.block_ids)
            up.lock_ref += 1
            up = up.parent  # type: ignore[assignment]
        return node, theirs

    @property
    def cached_blocks(self) -> int:
        return self._cached

    # -- invariants ------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """The tree's invariants (`radix_integrity.check_radix`); AssertionError if broken."""
        check_radix(self)


def _along(node: RadixNode, field: str) -> list:
    """The node's `field` lists (its blocks, its block hashes) from the root down to it,
    joined in token order."""
    parts = []
    while node.parent is not None:
        parts.append(getattr(node, field))
        node = node.parent
    return [x for part in reversed(parts) for x in part]
