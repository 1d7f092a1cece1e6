"""A finished prefill's KV kept for a remote decode (P/D, issue 13): vLLM's delay_free_blocks.

Why it exists apart from the scheduler: holding is a P/D concern with its own state (`held`,
read by the KV connector and the virtual P/D hop) that the step loop only triggers, when a
request with `hold_kv` ends by length. `KvHold` is a mixin of `Scheduler`: it uses the
scheduler's `kv`, `cache` and `pool`, and the scheduler creates `held` (it stays the one writer).
"""

from __future__ import annotations

from .block_pool import BlockPool
from .kv_manager import KVCacheManager
from .prefix_cache import PrefixCache
from .request import Request


class KvHold:
    """`_hold` and `release_held` (see the module docstring)."""

    kv: KVCacheManager
    cache: PrefixCache
    pool: BlockPool
    held: dict[str, tuple[list[int], object]]  # request id -> (blocks, cache node)

    def _hold(self, req: Request) -> None:
        """Keep a finished prefill's blocks (a pool reference each, its cache path locked so
        eviction never counts them) until `release_held`: vLLM's delay_free_blocks."""
        self.kv.cache_blocks(req)
        node = req.cache_node
        if node is not None:
            self.cache.lock(node)
        self.pool.share(req.block_ids)
        self.held[req.request_id] = (list(req.block_ids), node)

    def release_held(self, request_id: str) -> bool:
        """Free the blocks a finished prefill kept; False if none are held under that id."""
        entry = self.held.pop(request_id, None)
        if entry is None:
            return False
        blocks, node = entry
        if node is not None:
            self.cache.unlock(node)
        self.pool.free(blocks)
        return True
