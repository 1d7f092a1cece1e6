"""Per-request block tables over the block pool, shared with the prefix cache.

Contract (what the scheduler relies on):
- ``match(req)`` looks up the request's cached prefix (block-aligned, never the whole request:
  at least its last token is computed, to produce logits). Nothing is held until
  ``allocate_slots`` succeeds with that match. A hit of a request with vLLM's
  ``kv_cache_report_mode: "full"`` is reported to the KV events at each lookup, as vLLM's
  ``get_computed_blocks`` reports it.
- ``allocate_slots(req, n, match)`` makes room for ``n`` more computed tokens (after the
  matched prefix, if any), evicting unlocked cache blocks if the pool is short. All or nothing:
  on ``False`` nothing changed, and the scheduler preempts or stops admitting. Paged layout:
  blocks on demand, ceil(tokens / block_size). Contiguous layout (pre-vLLM baseline): the first
  call reserves ceil(max_len / block_size) blocks, later calls need nothing.
- ``cache_blocks(req, n)`` puts the full blocks among the request's first ``n`` tokens into the
  prefix cache and moves its lock to the deepest node. The scheduler calls it when it
  schedules those tokens (as vLLM v1 does): a request admitted later in the same step already
  shares them, which is sound because a forward pass writes each layer's KV for the whole
  batch before that layer's attention reads it. (Edge case: if the priority policy preempts a
  request after its chunk was scheduled in the same step, the chunk is undone but its blocks
  stay cached; only the emulated prefill accounting of a later exact match is affected.)
- ``free(req, cache=...)`` drops every reference the request holds (blocks, node lock);
  ``cache=True`` first stores its computed full blocks in the prefix cache.
- With a CPU offloading tier (``host``, vLLM's OffloadingConnector: ``kv_offload.py``), every
  full block ``cache_blocks`` offers the device cache is stored in the tier too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .block_pool import BlockPool
from .prefix_cache import PrefixCache, PrefixMatch
from .request import Request

if TYPE_CHECKING:
    from .kv_offload import HostKvTier

NO_MATCH = PrefixMatch(0, [], None)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(
        self, pool: BlockPool, cache: PrefixCache, *, kv_layout: str, max_model_len: int
    ) -> None:
        self.pool = pool
        self.cache = cache
        self.block_size = pool.block_size
        self.contiguous = kv_layout == "contiguous"
        self.max_model_len = max_model_len
        self.host: HostKvTier | None = None  # the CPU offloading tier (Scheduler.attach_offload)

    # -- capacity --------------------------------------------------------------------------
    @property
    def num_available_blocks(self) -> int:
        """Free blocks plus cached blocks that could be evicted now."""
        return self.pool.num_free + self.cache.evictable_blocks

    @property
    def usage(self) -> float:
        """KV usage as vLLM reports it: blocks neither free nor evictable, over the total."""
        return 1.0 - self.num_available_blocks / self.pool.num_blocks

    def fragmentation(self, running: list[Request]) -> float:
        """Share of the token slots in the running requests' blocks that hold no KV: the
        partly filled last block when paged, most of the reservation when contiguous."""
        slots = sum(len(r.block_ids) for r in running) * self.block_size
        used = sum(r.num_computed_tokens for r in running)
        return 1.0 - used / slots if slots else 0.0

    def blocks_needed_alone(self, req: Request) -> int:
        """Blocks the request needs at its longest, were it alone in the pool."""
        return cdiv(req.max_len(self.max_model_len), self.block_size)

    # -- per request -----------------------------------------------------------------------
    def reads_cache(self, req: Request) -> bool:
        """Whether the request's prefix is looked up (in the device cache, or the CPU tier
        behind it): not without a cache, nor for a request that skips reading it (vLLM's
        `prefix_cache_lookup_enabled`: prompt logprobs need every prompt token computed)."""
        return self.cache.enabled and not req.sampling_params.skip_reading_prefix_cache

    def num_cached_tokens(self, req: Request) -> int:
        """Prompt tokens the device cache holds for `req`, the last one always recomputed: a
        probe that touches nothing (vLLM's `KVCacheManager.get_num_cached_tokens`)."""
        if not self.reads_cache(req):
            return 0
        return self.cache.peek_prefix_len(req.token_ids[: req.num_tokens - 1], req.cache_ns)

    def match(self, req: Request) -> PrefixMatch:
        if req.block_ids or not self.reads_cache(req):
            return NO_MATCH
        tokens = req.token_ids
        match = self.cache.match_prefix(tokens, req.cache_ns, num_tokens=len(tokens) - 1)
        if match.num_tokens and req.kv_cache_report_mode == "full":  # vLLM's, per request
            self.cache.report_reused(match.node, tokens, req.cache_ns, req.session_id)
        return match

    def allocate_slots(
        self, req: Request, num_new_tokens: int, match: PrefixMatch = NO_MATCH
    ) -> bool:
        pool = self.pool
        if match.node is None and not self.contiguous:  # the common case: paged, no match
            need = -(-(req.num_computed_tokens + num_new_tokens) // self.block_size) - len(
                req.block_ids)
            if need <= 0:
                return True
            free = pool.num_free
            if need > free:
                if need > free + self.cache.evictable_blocks:
                    return False
                self.cache.evict(need - free)
            req.block_ids.extend(pool.allocate(need))
            return True
        num_cached_blocks = len(match.block_ids)
        if self.contiguous:
            target = self.blocks_needed_alone(req) if not req.block_ids else 0
        else:
            tokens = req.num_computed_tokens + match.num_tokens + num_new_tokens
            target = cdiv(tokens, self.block_size)
        need = max(0, target - len(req.block_ids) - num_cached_blocks)
        if match.node is not None:
            self.cache.lock(match.node)  # lock first: the matched blocks must not be evicted
        if need > pool.num_free:
            if need > pool.num_free + self.cache.evictable_blocks:
                if match.node is not None:
                    self.cache.unlock(match.node)
                return False
            self.cache.evict(need - pool.num_free)
        if match.node is not None:
            pool.share(match.block_ids)
            if pool.metrics is not None:  # vLLM's --kv-cache-metrics: a hit is an access
                pool.metrics.on_accessed(match.block_ids)
            req.block_ids = list(match.block_ids)
            req.cache_node = match.node
            req.num_computed_tokens = match.num_tokens
            req._tree_len = match.num_tokens
        if need:
            req.block_ids.extend(pool.allocate(need))
        return True

    def cache_blocks(self, req: Request, num_tokens: int | None = None) -> None:
        """Insert the full blocks among the first ``num_tokens`` tokens (default: the computed
        ones) into the prefix cache."""
        bs = self.block_size
        n = (req.num_computed_tokens if num_tokens is None else num_tokens) // bs
        tree_len = req._tree_len
        if n * bs <= tree_len or not self.cache.enabled:
            return
        node, theirs = self.cache.insert_from(
            req.cache_node, tree_len, req.token_ids, req.block_ids, n, req.cache_ns,
            req.session_id)
        if theirs:
            blocks = req.block_ids
            first = tree_len // bs
            for i, b in enumerate(theirs, first):
                if blocks[i] != b:  # computed twice concurrently: adopt the cache's copy
                    self.pool.share((b,))
                    self.pool.free((blocks[i],))
                    blocks[i] = b
        req.cache_node = node
        req._tree_len = n * bs
        if self.host is not None:
            self.host.store(req, n)

    def free(self, req: Request, *, cache: bool) -> None:
        if cache:
            self.cache_blocks(req)
            self.cache.touch_unlock(req.cache_node)  # its prefix was used until now (LRU)
        else:
            self.cache.unlock(req.cache_node)
        req.cache_node = None
        req._tree_len = 0
        if self.host is not None:
            self.host.forget(req.request_id)
        self.pool.free(req.block_ids)
        req.block_ids = []

    def check_integrity(self, live: list[Request], held: list[list[int]] = (),
                        lookahead: int = 0) -> None:
        """Pool and cache invariants, plus: every pool reference is accounted for by the live
        requests' block tables, the cache and the `held` blocks (P/D: a finished prefill's
        KV kept for its decode side) — no leaked block, no dangling reference. A request
        holds no more blocks than its tokens and `lookahead` more need (speculative decoding:
        the slots of drafts verification rejected stay allocated, as vLLM's)."""
        self.pool.check_integrity()
        self.cache.check_integrity()
        expected = [0] * self.pool.num_blocks
        for blocks in held:
            for b in blocks:
                expected[b] += 1
        for req in live:
            for b in req.block_ids:
                expected[b] += 1
            if len(req.block_ids) * self.block_size < req.num_computed_tokens:
                raise AssertionError(f"{req} computed more tokens than its blocks hold")
            if not self.contiguous and len(req.block_ids) > cdiv(req.num_tokens + lookahead,
                                                                  self.block_size):
                raise AssertionError(f"{req} holds more blocks than its tokens need")
            if req.cache_node is not None:
                path = self.cache.path_blocks(req.cache_node)
                tree_len = len(path) * self.block_size
                if req.block_ids[: len(path)] != path or tree_len != req._tree_len:
                    raise AssertionError(f"{req} does not use the cached blocks of its prefix")
            elif req._tree_len:
                raise AssertionError(f"{req} claims cached tokens without a cache node")
        for node_blocks in _cached_blocks(self.cache):
            for b in node_blocks:
                expected[b] += 1
        for b, n in enumerate(expected):
            if self.pool.ref_count(b) != n:
                raise AssertionError(
                    f"block {b}: pool count {self.pool.ref_count(b)}, holders found {n}"
                )


def _cached_blocks(cache: PrefixCache) -> list[list[int]]:
    roots = getattr(cache, "roots", None)
    if not roots:
        return []
    out, stack = [], list(roots.values())
    while stack:
        node = stack.pop()
        out.append(node.block_ids)
        stack.extend(node.children.values())
    return out


class NoKVCacheManager(KVCacheManager):
    """The manager of a model that keeps no KV cache (an encoder, `ModelSpec.holds_kv` false):
    vLLM's KVCacheManager with no KV-cache group. Every request fits, nothing is allocated or
    cached, and the pool is vLLM's single null block, always free (KV usage 0)."""

    @property
    def usage(self) -> float:
        return 0.0

    def blocks_needed_alone(self, req: Request) -> int:
        return 0

    def match(self, req: Request) -> PrefixMatch:
        return NO_MATCH

    def num_cached_tokens(self, req: Request) -> int:
        return 0

    def allocate_slots(
        self, req: Request, num_new_tokens: int, match: PrefixMatch = NO_MATCH
    ) -> bool:
        return True

    def cache_blocks(self, req: Request, num_tokens: int | None = None) -> None:
        return None

    def check_integrity(self, live: list[Request], held: list[list[int]] = (),
                        lookahead: int = 0) -> None:
        """The pool is whole and free, and no request holds a block or a cache node."""
        self.pool.check_integrity()
        if self.pool.num_free != self.pool.num_blocks:
            raise AssertionError("a model without a KV cache allocated a block")
        for req in live:
            if req.block_ids or req.cache_node is not None:
                raise AssertionError(f"{req} holds KV blocks on a model without a KV cache")
