"""Waiting-queue policies: who is admitted next, and who is preempted first.

Contract of a ``WaitingQueue`` (the scheduler uses nothing else):
- holds the WAITING and PREEMPTED requests; ``add`` a new one, ``add_preempted`` one that was
  just preempted (it goes back to the front — under ``priority``, to its place by priority);
- ``prepare(cache)`` is called once per step before admitting (a policy may reorder then);
- ``peek()`` is the next request to admit, ``pop()`` removes it; the scheduler stops admitting
  at the first request that does not fit (no skipping ahead, as in vLLM);
- ``remove(req)`` takes out any request (abort);
- ``choose_victim(running)`` names the running request to preempt when KV runs out.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator

from .prefix_cache import PrefixCache
from .request import Request, RequestStatus


class WaitingQueue(ABC):
    @abstractmethod
    def add(self, req: Request) -> None: ...

    @abstractmethod
    def add_preempted(self, req: Request) -> None: ...

    @abstractmethod
    def peek(self) -> Request: ...

    @abstractmethod
    def pop(self) -> Request: ...

    @abstractmethod
    def remove(self, req: Request) -> None: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Request]: ...

    def prepare(self, cache: PrefixCache) -> None:  # noqa: B027 - optional hook
        """Reorder before this step's admissions, if the policy wants to."""

    def choose_victim(self, running: list[Request]) -> Request:
        """The newest running request (the last admitted), as vLLM does under FCFS."""
        return running[-1]

    def add_landed(self, req: Request, landed: set[str]) -> None:
        """A request whose async KV load landed: it waits ahead of every other request,
        behind those that landed before it (vLLM's kv_holding_waiting queue, drained first);
        `landed` holds their ids. A policy with an order of its own places it by that."""
        self.add_preempted(req)

    def cache_aware_reorder(  # noqa: B027 - FCFS's alone
            self, window: int, cached: Callable[[Request], int]) -> None:
        """vLLM's cache-aware admission (FCFS only: see FCFSQueue); other policies keep
        their order."""


class FCFSQueue(WaitingQueue):
    """First come, first served; preempted requests go back to the front."""

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, req: Request) -> None:
        self._q.append(req)

    def add_preempted(self, req: Request) -> None:
        self._q.appendleft(req)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove(self, req: Request) -> None:
        self._q.remove(req)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)

    def add_landed(self, req: Request, landed: set[str]) -> None:
        i = 0
        for r in self._q:
            if r.request_id not in landed:
                break
            i += 1
        self._q.insert(i, req)

    def cache_aware_reorder(self, window: int, cached: Callable[[Request], int]) -> None:
        """vLLM 0.34.0's cache-aware admission (`_reorder_waiting_by_cached_prefix`): among
        the first `window` requests, those merely waiting (WAITING, nothing computed) take
        their own slots again deepest `cached` prefix first, arrival order among equals; a
        preempted request, or one holding the KV a load brought, keeps its slot and nothing
        moves past it. Why: a cold prompt admitted first could evict blocks a request with
        a resident prefix still needs."""
        if len(self._q) < 2:
            return
        head = list(itertools.islice(self._q, window))
        slots = [i for i, r in enumerate(head)
                 if r.status == RequestStatus.WAITING and not r.num_computed_tokens]
        if len(slots) < 2:
            return
        depth = {i: cached(head[i]) for i in slots}
        order = sorted(slots, key=lambda i: (-depth[i], i))
        if order == slots:
            return
        reordered = list(head)
        for slot, source in zip(slots, order, strict=True):
            reordered[slot] = head[source]
        for _ in head:
            self._q.popleft()
        self._q.extendleft(reversed(reordered))


class PriorityQueue(WaitingQueue):
    """Lowest ``priority`` value first, then earliest arrival (vLLM's rule). A preempted
    request re-enters at its place by that key; the victim is the running request with the
    largest (priority, arrival) key — the least important, newest one."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._seq = itertools.count()

    def _push(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival_time, next(self._seq), req))

    add = _push
    add_preempted = _push

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, req: Request) -> None:
        self._heap = [e for e in self._heap if e[3] is not req]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """In priority order."""
        return (e[3] for e in sorted(self._heap, key=lambda e: e[:3]))

    def choose_victim(self, running: list[Request]) -> Request:
        return max(reversed(running), key=lambda r: (r.priority, r.arrival_time))


class LongestPrefixMatchQueue(FCFSQueue):
    """SGLang's cache-aware policy: admit the requests with the longest cached prefix first
    (FCFS among equals); preempted requests stay ahead of the rest. When more than
    ``fcfs_threshold`` requests wait, matching them all costs too much and the order is FCFS."""

    def __init__(self, fcfs_threshold: int = 128) -> None:
        super().__init__()
        self.fcfs_threshold = fcfs_threshold

    def prepare(self, cache: PrefixCache) -> None:
        if not cache.enabled or len(self._q) < 2 or len(self._q) > self.fcfs_threshold:
            return
        keyed = [
            (
                r.status != RequestStatus.PREEMPTED,
                -cache.peek_prefix_len(r.token_ids[: r.num_tokens - 1], r.cache_ns),
                i,
                r,
            )
            for i, r in enumerate(self._q)
        ]
        keyed.sort(key=lambda e: e[:3])
        self._q = deque(e[3] for e in keyed)


def make_queue(policy: str, lpm_fcfs_threshold: int = 128) -> WaitingQueue:
    if policy == "fcfs":
        return FCFSQueue()
    if policy == "priority":
        return PriorityQueue()
    if policy == "lpm":
        return LongestPrefixMatchQueue(lpm_fcfs_threshold)
    raise ValueError(f"unknown policy {policy!r}")
