"""The radix cache's LRU side: locks, the logical clock, eviction candidates and eviction.

`RadixLru` is the base of `radix_cache.RadixCache`, which owns the tree (roots, node ids, the
cached and node counters, KV events) and its lookups and insertions. This half decides which
blocks may go and in which order, over the same nodes:

- ``lock``/``unlock`` count a node's users and all its ancestors'; only an unlocked node's
  blocks count as evictable (``evictable_blocks``), since only the tree holds them then.
- A logical clock (``_tick``: exact and deterministic, unlike wall time) stamps a node's
  ``last_access`` whenever a walk, insertion or finishing request touches it.
- Eviction candidates are a lazy min-heap of ``(last_access, id, node)``, pushed whenever a node
  may have become an unlocked leaf or was touched while being one; stale entries are skipped
  when popped, and the heap is rebuilt when stale ones dominate.
- ``evict(n)`` frees up to ``n`` blocks least recently used first, trimming a leaf from its
  tail and removing it once empty (its parent may then become a candidate); the freed blocks
  go to the pool in eviction order, which decides the block ids handed out next.
"""

from __future__ import annotations

import heapq

from .block_pool import BlockPool
from .kv_events import KvEventLog
from .radix_node import RadixNode


class RadixLru:
    """Locks, LRU candidates and eviction of a `RadixCache` (see the module docstring)."""

    # the tree's, set up by RadixCache.__init__; evict updates the counters and reports
    pool: BlockPool
    block_size: int
    events: KvEventLog | None
    _cached: int  # blocks in the tree
    _num_nodes: int  # nodes in the tree, roots excluded

    def __init__(self) -> None:
        self._clock = 0  # logical LRU clock
        self._evictable = 0  # blocks of unlocked nodes
        self._heap: list[tuple[int, int, RadixNode]] = []  # eviction candidates (lazy)

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

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

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

    # -- LRU times -------------------------------------------------------------------------
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
