"""The KV block pool: fixed-size pages of KV cache, handed out and taken back in O(1).

Contract:
- The pool has ``num_blocks`` blocks of ``block_size`` token slots each; block ids are
  ``0 .. num_blocks-1``. The count comes from the device's placement (KV bytes ÷ bytes per block).
- Every used block has a reference count ≥ 1: one per holder (a request's block table, a radix
  cache node). ``allocate`` hands out blocks with count 1; ``share`` adds a holder; ``free`` drops
  one holder per id and returns a block to the free list when its last holder lets go.
- ``allocate(n)`` is all-or-nothing: callers ask ``can_allocate(n)`` first (or catch
  ``NoFreeBlocksError``). Nothing is ever evicted here; making room is the cache's job.
- ``metrics`` (vLLM's ``--kv-cache-metrics``, off by default) is told of every block handed out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .kv_metrics import KVCacheMetricsCollector


class NoFreeBlocksError(RuntimeError):
    """``allocate`` was asked for more blocks than are free."""


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks, block_size >= 1; got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._ref_counts = [0] * num_blocks
        # A stack: popping from the end reuses the most recently freed block first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self.metrics: KVCacheMetricsCollector | None = None

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (held by a request or by the prefix cache)."""
        return self.num_used / self.num_blocks

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    # -- mutation --------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks, each with reference count 1. All or nothing."""
        if n > len(self._free):
            raise NoFreeBlocksError(f"asked for {n} blocks, {len(self._free)} free")
        if n <= 0:
            return []
        free = self._free
        if n == 1:  # a decode crossing into a new block: the common case
            b = free.pop()
            self._ref_counts[b] = 1
            if self.metrics is not None:
                self.metrics.on_allocated((b,))
            return [b]
        blocks = free[-n:]
        del free[-n:]
        blocks.reverse()
        refs = self._ref_counts
        for b in blocks:
            refs[b] = 1
        if self.metrics is not None:
            self.metrics.on_allocated(blocks)
        return blocks

    def share(self, block_ids: Iterable[int]) -> None:
        """Add one holder to each (already used) block."""
        refs = self._ref_counts
        for b in block_ids:
            if refs[b] <= 0:
                raise ValueError(f"cannot share free block {b}")
            refs[b] += 1

    def free(self, block_ids: Iterable[int]) -> int:
        """Drop one holder from each block; returns how many blocks became free."""
        refs = self._ref_counts
        release = self._free.append
        freed = 0
        for b in block_ids:
            r = refs[b]
            if r > 1:
                refs[b] = r - 1
            elif r == 1:
                refs[b] = 0
                release(b)
                freed += 1
            else:
                raise ValueError(f"double free of block {b}")
        return freed

    def free_sole(self, block_ids: list[int]) -> None:
        """Return blocks whose only holder lets go (the prefix cache evicting): ``free``
        with the check that each one really becomes free (AssertionError otherwise)."""
        refs = self._ref_counts
        for b in block_ids:
            if refs[b] != 1:
                raise AssertionError(f"block {b} has {refs[b]} holders, not 1")
            refs[b] = 0
        self._free.extend(block_ids)

    # -- invariants ------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise AssertionError unless: free + used = total, no block twice in the free list,
        free blocks have count 0, used blocks count ≥ 1, no count is negative."""
        free_set = set(self._free)
        if len(free_set) != len(self._free):
            raise AssertionError("duplicate block in the free list")
        used = 0
        for b, r in enumerate(self._ref_counts):
            if r < 0:
                raise AssertionError(f"block {b} has negative ref count {r}")
            if b in free_set:
                if r != 0:
                    raise AssertionError(f"free block {b} has ref count {r}")
            elif r == 0:
                raise AssertionError(f"block {b} has ref count 0 but is not free (leaked)")
            else:
                used += 1
        if used + len(free_set) != self.num_blocks:
            raise AssertionError(f"free {len(free_set)} + used {used} != {self.num_blocks}")

    def __repr__(self) -> str:
        return f"BlockPool(blocks={self.num_blocks}, size={self.block_size}, free={self.num_free})"
