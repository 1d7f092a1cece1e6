"""vLLM's KV-cache residency metrics (`--kv-cache-metrics`): how long a sampled block lived,
how long it sat idle before its eviction, and the gaps between its reuses, on the emulated
timeline.

Followed: vLLM 0.33.0 `vllm/v1/core/kv_cache_metrics.py` (`KVCacheMetricsCollector`,
`BlockMetricsState`) and its hooks in `vllm/v1/core/block_pool.py`:
- a block the pool hands out is sampled with probability `sample_rate` (vLLM's default 0.01);
- a prefix-cache hit on a sampled block records an access (a ring of the last four);
- with prefix caching on, a block handed out again is an eviction: vLLM's pool evicts a
  block's cached identity exactly when it takes the block from its free queue for a new owner.
  The event's lifetime is allocation → eviction, its idle time last access (or allocation) →
  eviction, its reuse gaps those between the recorded accesses. Without prefix caching vLLM
  records no eviction, and neither does this;
- a prefix-cache reset forgets every sampled block and every undelivered event.

Times are emulated seconds: the engine loop sets `now` to the start of each step, the moment
its scheduler allocates (the core itself never reads a clock). Sampling draws from a seeded
generator, so a run is reproducible (vLLM draws from `random`).

Why apart from the pool: it is optional (off, the pool pays one `is None` test per call) and
only the engine process's metrics read it (`server/engine_proc/stats.py` drains the events
into `vllm:kv_block_{lifetime,idle_before_evict,reuse_gap}_seconds` once per step).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

HISTORY = 4  # accesses kept per block (vLLM's deque maxlen)


@dataclass(frozen=True, slots=True)
class KVCacheEvictionEvent:
    """One sampled block's life, as vLLM's `KVCacheEvictionEvent` (emulated seconds)."""

    lifetime_seconds: float
    idle_seconds: float
    reuse_gaps_seconds: tuple[float, ...]


class _BlockState:
    __slots__ = ("birth", "history", "last_access")

    def __init__(self, now: float) -> None:
        self.birth = self.last_access = now
        self.history: deque[float] = deque(maxlen=HISTORY)


class KVCacheMetricsCollector:
    def __init__(self, sample_rate: float = 0.01, *, evictions: bool = True,
                 seed: int = 0) -> None:
        if not 0 < sample_rate <= 1:
            raise ValueError(f"kv_cache_metrics_sample must be in (0, 1], got {sample_rate}")
        self.sample_rate = sample_rate
        self.evictions = evictions  # prefix caching on: a re-allocation evicts
        self.now = 0.0  # emulated seconds, set by the engine loop
        self._random = random.Random(seed).random
        self.blocks: dict[int, _BlockState] = {}
        self.events: list[KVCacheEvictionEvent] = []

    def on_allocated(self, block_ids: Iterable[int]) -> None:
        """The pool handed these blocks to a new owner."""
        now, blocks, draw, rate = self.now, self.blocks, self._random, self.sample_rate
        evict = blocks.pop if self.evictions else None
        for b in block_ids:
            if evict is not None and (state := evict(b, None)) is not None:
                self._evicted(state)
            if draw() < rate:
                blocks[b] = _BlockState(now)

    def on_accessed(self, block_ids: Iterable[int]) -> None:
        """A request hit these cached blocks."""
        blocks, now = self.blocks, self.now
        for b in block_ids:
            state = blocks.get(b)
            if state is not None:
                state.last_access = now
                state.history.append(now)

    def _evicted(self, state: _BlockState) -> None:
        h = state.history
        gaps = tuple(h[i] - h[i - 1] for i in range(1, len(h)))
        self.events.append(KVCacheEvictionEvent(self.now - state.birth,
                                                self.now - state.last_access, gaps))

    def reset(self) -> None:
        """The prefix cache was emptied: forget every sampled block and pending event."""
        self.blocks.clear()
        self.events.clear()

    def drain_events(self) -> list[KVCacheEvictionEvent]:
        events, self.events = self.events, []
        return events
