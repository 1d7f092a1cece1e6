"""The prefix-cache contract, and the no-op cache of the "prefix cache off" baseline
(SGLang's radix tree is `radix_cache.RadixCache`).

Contract of a ``PrefixCache`` (what the KV manager relies on):

- ``match_prefix(tokens)`` returns the longest cached prefix of ``tokens`` that ends on a block
  boundary, the blocks that hold its KV, and a node handle. The match is the token-granular
  longest common prefix rounded *down* to a whole block (a 40-token overlap with 16-token blocks
  serves 32 tokens; the request prefills the other 8 again), as vLLM and SGLang do with 16-token
  pages. The caller ``share``s the returned blocks in the pool (the request becomes a holder)
  and ``lock``s the node while the request runs.
- ``lock(node)`` / ``unlock(node)`` count users of a node and of all its ancestors. A locked node
  is never evicted.
- ``insert(tokens, blocks)`` stores a block-aligned prefix whose KV lives in ``blocks`` (one
  block per ``block_size`` tokens; the caller still holds its own references). The cache takes
  a pool reference on each block it did not hold yet. It returns the node ending at that prefix
  and the blocks the cache holds for the whole prefix: where the cache already had a block for
  some position (another request computed the same tokens), the caller should switch to the
  cache's block and free its duplicate.
- ``evict(n)`` frees up to ``n`` blocks that only the cache holds, least recently used first:
  unlocked leaves are trimmed from their tail, and a parent that becomes an unlocked leaf joins
  the candidates (cascading upward). Returns the number of blocks returned to the pool.
- ``evictable_blocks`` counts blocks ``evict`` could free right now.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .block_pool import BlockPool

# A prefix-cache namespace: blocks are shared only within one. A LoRA adapter's id (0: the base
# model), or (that id, cache_salt) for a request with vLLM's cache_salt.
Namespace = int | tuple[int, str]


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    num_tokens: int  # block-aligned number of cached tokens
    block_ids: list[int]  # len == num_tokens // block_size
    node: Any  # handle for lock/unlock; None when nothing matched


class PrefixCache(ABC):
    """The interface shared by ``RadixCache`` and ``NoPrefixCache`` (see the module docstring)."""

    enabled: bool

    @abstractmethod
    def match_prefix(self, token_ids: Sequence[int], ns: Namespace = 0, *,
                     num_tokens: int | None = None) -> PrefixMatch:
        """``ns``: the namespace the tokens run in (the LoRA adapter, 0 for the base model, and
        the request's cache salt); each has its own cached prefixes. ``num_tokens``: match only
        the first that many of ``token_ids`` (default: all), without the caller slicing them."""

    @abstractmethod
    def peek_prefix_len(self, token_ids: Sequence[int], ns: Namespace = 0) -> int:
        """Like ``match_prefix(...).num_tokens`` with no side effect (no split, no LRU touch)."""

    @abstractmethod
    def lock(self, node: Any) -> None: ...

    @abstractmethod
    def unlock(self, node: Any) -> None: ...

    @abstractmethod
    def insert(
        self,
        token_ids: Sequence[int],
        block_ids: Sequence[int],
        start: tuple[Any, int] | None = None,
        ns: Namespace = 0,
        session_id: str | None = None,
    ) -> tuple[Any, list[int]]:
        """``start=(node, n)``: the caller knows ``node`` ends at token ``n`` of this path (its
        locked node), so the walk may begin there instead of at the root. ``session_id``: the
        storing request's session (vLLM's), which its KV events name."""

    @abstractmethod
    def touch(self, node: Any) -> None:
        """Mark ``node`` and its ancestors used now (LRU)."""

    def touch_unlock(self, node: Any) -> None:
        """``touch(node)`` then ``unlock(node)`` (a cache may do both in one pass)."""
        self.touch(node)
        self.unlock(node)

    @abstractmethod
    def insert_from(self, start: Any, num_known: int, token_ids: Sequence[int],
                    block_ids: list[int], num_blocks: int, ns: Namespace = 0,
                    session_id: str | None = None) -> tuple[Any, list[int]]:
        """A request's ``insert`` of its first ``num_blocks`` blocks (its lists unsliced),
        with its lock moved from ``start`` (its locked node, ending at token ``num_known``;
        None, 0 if none) to the returned node. Returns that node and the blocks the cache
        already held for the positions it walked from ``num_known`` on (the caller adopts
        those); the blocks after them are the caller's own."""

    def path_blocks(self, node: Any) -> list[int]:
        """The blocks from the root down to ``node``, in token order."""
        return []

    def report_reused(self, node: Any, token_ids: Sequence[int], ns: Namespace,
                      session_id: str | None) -> None:
        """KV events: tell of the cached prefix ending at ``node`` (a match of ``token_ids``);
        a cache that reports no events does nothing."""
        return None

    @abstractmethod
    def evict(self, num_blocks: int) -> int: ...

    @property
    @abstractmethod
    def evictable_blocks(self) -> int: ...

    @property
    @abstractmethod
    def cached_blocks(self) -> int: ...

    @abstractmethod
    def check_integrity(self) -> None: ...


class NoPrefixCache(PrefixCache):
    """Prefix caching off (the baseline): nothing is ever matched, stored or evicted."""

    enabled = False

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool

    def match_prefix(self, token_ids: Sequence[int], ns: Namespace = 0, *,
                     num_tokens: int | None = None) -> PrefixMatch:
        return PrefixMatch(0, [], None)

    def peek_prefix_len(self, token_ids: Sequence[int], ns: Namespace = 0) -> int:
        return 0

    def lock(self, node: Any) -> None:
        pass

    def unlock(self, node: Any) -> None:
        pass

    def insert(
        self,
        token_ids: Sequence[int],
        block_ids: Sequence[int],
        start: tuple[Any, int] | None = None,
        ns: Namespace = 0,
        session_id: str | None = None,
    ) -> tuple[Any, list[int]]:
        return None, list(block_ids)

    def touch(self, node: Any) -> None:
        pass

    def insert_from(self, start: Any, num_known: int, token_ids: Sequence[int],
                    block_ids: list[int], num_blocks: int, ns: Namespace = 0,
                    session_id: str | None = None) -> tuple[Any, list[int]]:
        return None, []

    def evict(self, num_blocks: int) -> int:
        return 0

    @property
    def evictable_blocks(self) -> int:
        return 0

    @property
    def cached_blocks(self) -> int:
        return 0

    def check_integrity(self) -> None:
        pass
