"""SGLang's radix tree over token ids: the prefix cache (contract in `prefix_cache.py`).

Ownership (why keys are whole blocks): a node's key is a whole number of blocks and each block
belongs to exactly one node, so splitting a node (on a partial match) never splits a block and
a block is never owned by two nodes. A partially filled last block of a request is never
inserted; it is freed with the request (the next request recomputes those < block_size tokens).
Every cached block carries exactly one pool reference for the tree; requests using it hold
their own. Hence an unlocked node's blocks have pool reference count exactly 1 (evicting them
really frees memory), which ``check_integrity`` verifies.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence

from .block_pool import BlockPool
from .kv_events import KvEventLog
from .prefix_cache import NoPrefixCache, PrefixCache, PrefixMatch

__all__ = ["NoPrefixCache", "PrefixCache", "PrefixMatch", "RadixCache", "RadixNode"]  # re-exported


class RadixNode:
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


class RadixCache(PrefixCache):
    """SGLang-style radix tree over token ids, with block-aligned keys (see module docstring)."""

    enabled = True

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self._ids = itertools.count()
        self._clock = 0  # logical LRU clock: exact and deterministic, unlike wall time
        self.root = RadixNode((), [], None, next(self._ids))
        self.root.lock_ref = 1  # the root is never evicted
        # --- LoRA (issue 13): one tree per adapter (0: the base model), so two adapters never
        # share a block and one adapter shares its own, as vLLM's block hashes keyed by the
        # LoRA name (extra_keys) do
        self.roots: dict[int, RadixNode] = {0: self.root}
        self._evictable = 0
        self._cached = 0
        self._num_nodes = 0
        # Eviction candidates: a lazy min-heap of (last_access, id, node), pushed whenever a
        # node may have become an unlocked leaf or was touched while being one; stale entries
        # are skipped when popped, and the heap is rebuilt when stale ones dominate.
        self._heap: list[tuple[int, int, RadixNode]] = []
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
        holds a block; on success the log gets one ``AllBlocksCleared``, no per-block removal."""
        pool = self.pool
        if pool.num_free + self._cached != pool.num_blocks or any(
                c.lock_ref for c in self.root.children.values()):
            return False
        for node in self._iter_nodes():
            if node.parent is not None:
                pool.free(node.block_ids)
        self.root.children.clear()
        self._heap.clear()
        self._evictable = self._cached = self._num_nodes = 0
        if self.events is not None:
            self.events.cleared()
        return True
    # --- end KV events ---

    def _candidate(self, node: RadixNode) -> None:
        if not node.children and node.lock_ref == 0 and node.parent is not None:
            heapq.heappush(self._heap, (node.last_access, node.id, node))

    @staticmethod
    def _valid(entry: tuple[int, int, RadixNode]) -> bool:
        node = entry[2]
        return (
            node.parent is not None
            and not node.children
            and node.lock_ref == 0
            and entry[0] == node.last_access
        )

    # -- lookup ----------------------------------------------------------------------------
    def _root(self, lora: int, create: bool) -> RadixNode | None:
        root = self.roots.get(lora)
        if root is None and create:
            root = self.roots[lora] = RadixNode((), [], None, next(self._ids))
            root.lock_ref = 1
        return root

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _walk(
        self,
        token_ids: Sequence[int],
        *,
        touch: bool,
        split: bool,
        start: tuple[RadixNode, int] | None = None,
        lora: int = 0,
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
            root = self._root(lora, create=split)
            if root is None:
                return self.root, 0  # nothing cached for this adapter
            node, pos = root, 0
        now = self._tick() if touch else 0
        while pos < n:
            child = node.children.get(tuple(token_ids[pos : pos + bs]))
            if child is None:
                break
            i, klen = _matched(child, token_ids, pos, n, bs)
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

    def match_prefix(self, token_ids: Sequence[int], lora: int = 0, *,
                     num_tokens: int | None = None) -> PrefixMatch:
        node, num_tokens = self._walk(token_ids, touch=True, split=True, lora=lora,
                                      limit=num_tokens)
        if num_tokens == 0:
            return PrefixMatch(0, [], None)
        return PrefixMatch(num_tokens, self.path_blocks(node), node)

    def peek_prefix_len(self, token_ids: Sequence[int], lora: int = 0) -> int:
        return self._walk(token_ids, touch=False, split=False, lora=lora)[1]

    def path_blocks(self, node: RadixNode) -> list[int]:
        parts = []
        while node.parent is not None:
            parts.append(node.block_ids)
            node = node.parent
        return [b for part in reversed(parts) for b in part]

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

    # -- locking ---------------------------------------------------------------------------
    def lock(self, node: RadixNode | None) -> None:
        while node is not None and node.parent is not None:
            if node.lock_ref == 0:
                self._evictable -= len(node.block_ids)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: RadixNode | None) -> None:
        while node is not None and node.parent is not None:
            if node.lock_ref <= 0:
                raise AssertionError(f"unlock of unlocked node {node}")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.block_ids)
                self._candidate(node)
            node = node.parent

    # -- insertion -------------------------------------------------------------------------
    def insert(
        self,
        token_ids: Sequence[int],
        block_ids: Sequence[int],
        start: tuple[RadixNode | None, int] | None = None,
        lora: int = 0,
    ) -> tuple[RadixNode | None, list[int]]:
        bs = self.block_size
        if len(token_ids) != len(block_ids) * bs:
            raise ValueError(f"{len(token_ids)} tokens do not fill {len(block_ids)} blocks")
        node, pos = self._walk(token_ids, touch=True, split=True, start=start,  # type: ignore[arg-type]
                               lora=lora)
        tree_blocks = self.path_blocks(node) if pos else []
        if pos < len(token_ids):
            new_blocks = list(block_ids[pos // bs :])
            self.pool.share(new_blocks)
            key = tuple(token_ids[pos:])
            leaf = RadixNode(key, new_blocks, node, next(self._ids), self._clock)
            if self.events is not None:
                parent = node.hashes[-1] if node.hashes else None
                leaf.hashes = self.events.hashes(parent, key, lora)
                self.events.stored(parent, leaf.hashes, key, lora)
            node.children[key[:bs]] = leaf
            self._evictable += len(new_blocks)
            self._cached += len(new_blocks)
            self._num_nodes += 1
            self._candidate(leaf)
            tree_blocks.extend(new_blocks)
            node = leaf
        return (node if node.parent is not None else None), tree_blocks

    def touch(self, node: RadixNode | None) -> None:
        now = self._tick()
        while node is not None and node.parent is not None:
            node.last_access = now
            self._candidate(node)
            node = node.parent

    def touch_unlock(self, node: RadixNode | None) -> None:
        """``touch(node)`` then ``unlock(node)`` in one pass up the path (a finishing request).
        Exact because the path is locked while touched, so the touch queues nothing."""
        now = self._tick()
        heap = self._heap
        while node is not None and node.parent is not None:
            node.last_access = now
            lock_ref = node.lock_ref - 1
            if lock_ref < 0:
                raise AssertionError(f"unlock of unlocked node {node}")
            node.lock_ref = lock_ref
            if lock_ref == 0:
                self._evictable += len(node.block_ids)
                if not node.children:
                    heapq.heappush(heap, (now, node.id, node))
            node = node.parent

    def insert_from(
        self,
        start: RadixNode | None,
        num_known: int,
        token_ids: Sequence[int],
        block_ids: list[int],
        num_blocks: int,
        lora: int = 0,
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
            root = self._root(lora, create=True)
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
            i, klen = _matched(child, token_ids, pos, end, bs)
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
                leaf.hashes = self.events.hashes(parent_hash, key, lora)
                self.events.stored(parent_hash, leaf.hashes, key, lora)
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

    # -- eviction --------------------------------------------------------------------------
    def evict(self, num_blocks: int) -> int:
        if num_blocks <= 0 or self._evictable == 0:
            return 0
        heap = self._heap
        if len(heap) > 2 * self._num_nodes + 64:  # mostly stale: rebuild
            heap[:] = [e for e in heap if self._valid(e)]
            heapq.heapify(heap)
        if heap:  # the common case, a decode's block: the tail of the LRU leaf is enough
            last, _, node = heap[0]
            blocks = node.block_ids
            if (num_blocks < len(blocks) and last == node.last_access and not node.lock_ref
                    and not node.children and node.parent is not None and self.events is None):
                victims = blocks[-num_blocks:]  # what the loop below does in its first pass
                del blocks[-num_blocks:]
                self.pool.free_sole(victims)
                self._evictable -= num_blocks
                self._cached -= num_blocks
                return num_blocks
        bs, events, free_sole = self.block_size, self.events, self.pool.free_sole
        heappop, heapreplace = heapq.heappop, heapq.heapreplace
        freed = 0
        released: list[int] = []  # in eviction order: the pool's free list gets them so
        while freed < num_blocks and heap:
            last, _, node = heap[0]  # the least recently used candidate
            parent = node.parent
            if parent is None or node.children or node.lock_ref or last != node.last_access:
                heappop(heap)  # stale (see _valid)
                continue
            blocks = node.block_ids
            take = num_blocks - freed
            if take < len(blocks):  # trim the tail; the leaf keeps its head and its place
                victims = blocks[-take:]
                del blocks[-take:]
                if events is not None:
                    events.removed(node.hashes[-1 : -take - 1 : -1])
                    del node.hashes[-take:]
            else:
                victims, take = blocks, len(blocks)
                if events is not None:
                    events.removed(node.hashes[::-1])
                siblings = parent.children
                if len(siblings) == 1:
                    siblings.clear()
                else:
                    del siblings[node.key[:bs]]
                node.parent = None
                self._num_nodes -= 1
                if not siblings and parent.lock_ref == 0 and parent.parent is not None:
                    heapreplace(heap, (parent.last_access, parent.id, parent))  # _candidate
                else:
                    heappop(heap)
            released += victims
            freed += take
        free_sole(released)
        self._evictable -= freed
        self._cached -= freed
        return freed

    @property
    def evictable_blocks(self) -> int:
        return self._evictable

    @property
    def cached_blocks(self) -> int:
        return self._cached

    # -- invariants ------------------------------------------------------------------------
    def _iter_nodes(self) -> Iterator[RadixNode]:
        stack = list(self.roots.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def check_integrity(self) -> None:
        """Raise AssertionError unless: keys cover whole blocks, parent/child links agree, lock
        counts are ≥ 0 and a node's count ≥ the sum of its children's, no block is in two
        nodes, every cached block is used in the pool (tree ⊆ pool), an unlocked node's blocks
        are held by the tree alone, the evictable/cached/node counters match the tree, and
        every unlocked leaf is queued for eviction with its current LRU time."""
        bs = self.block_size
        seen: set[int] = set()
        evictable = 0
        for node in self._iter_nodes():
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
                refs = self.pool.ref_count(b)
                if refs < 1:
                    raise AssertionError(f"cached block {b} is free in the pool")
                if node.lock_ref == 0 and refs != 1:
                    raise AssertionError(f"unlocked cached block {b} has {refs} holders")
            if node.lock_ref == 0:
                evictable += len(node.block_ids)
            if self.events is not None and len(node.hashes) != len(node.block_ids):
                raise AssertionError(f"{node} has {len(node.hashes)} hashes for "
                                     f"{len(node.block_ids)} blocks")
        nodes = [n for n in self._iter_nodes() if n.parent is not None]
        if len(nodes) != self._num_nodes:
            raise AssertionError(f"node count drifted: {self._num_nodes} vs {len(nodes)}")
        queued = {e[2].id for e in self._heap if self._valid(e)}
        for n in nodes:
            if not n.children and n.lock_ref == 0 and n.id not in queued:
                raise AssertionError(f"evictable leaf {n} is missing from the LRU heap")
        if evictable != self._evictable or len(seen) != self._cached:
            raise AssertionError(
                f"counters drifted: evictable {self._evictable} vs {evictable}, "
                f"cached {self._cached} vs {len(seen)}"
            )


def _matched(child, token_ids, pos: int, end: int, bs: int) -> tuple[int, int]:
    """How many tokens of `child`'s key (its first block already matched) equal `token_ids`
    from `pos`, in whole blocks, before `end`; and the key's length in tokens."""
    key, i, klen = child.key, bs, len(child.block_ids) * bs
    while i < klen and pos + i < end and _eq(key, i, token_ids, pos + i, bs):
        i += bs
    return i, klen


def _eq(key: tuple[int, ...], i: int, tokens: Sequence[int], j: int, n: int) -> bool:
    """key[i:i+n] == tokens[j:j+n] without building two slices."""
    return key[i : i + n] == tuple(tokens[j : j + n])
