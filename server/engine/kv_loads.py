"""Async KV loads in the scheduler (vLLM's WAITING_FOR_REMOTE_KVS): from the CPU offloading
tier, and a decode pod's pulls of remotely prefilled KV (P/D, `kv_pulls.RemotePulls`), which
go through the same steps 2–3 below, started by the expectation the NIXL connector announced.

Why it exists apart from the scheduler: the tier (`kv_offload.HostKvTier`) is an optional
connector with its own state; the scheduler only triggers it at admission and at the start
of each step. `KvLoads` is a mixin of `Scheduler`, as `KvHold` is: it uses the scheduler's
`kv`, `waiting`, `requests` and `stats`, and the scheduler stays the one writer of all of them.

A request's life with the tier (vLLM 0.33.0's scheduler with the OffloadingConnector):
1. At admission its device hit is looked up, then the tier past it (`HostKvTier.lookup`).
2. With a hit, device blocks are allocated for its whole prompt (all or nothing, as an
   admission; vLLM allocates the part past the loaded tokens at its admission after the load,
   which can leave requests holding loaded blocks in a full pool with nothing running), the
   request leaves the queue, waits holding them, and the load starts on the host link
   (`HostKvTier.start`); it takes no seat and no token budget.
3. At the first step starting at or after the load's end (`_land`), its tokens are computed
   and cached in the device cache, and it goes back to the front of the queue holding its
   blocks (`landed`), to be admitted like a request continuing a prefill.
The connector's counters are recorded once, at step 2 (vLLM's `connector_prefix_cache_stats`:
queries = prompt tokens past the device hit, hits = the tokens loaded, source "host").
"""

from __future__ import annotations

from .kv_manager import KVCacheManager
from .kv_offload import HostKvTier, Load
from .kv_pulls import RemotePulls
from .policy import WaitingQueue
from .prefix_cache import PrefixMatch
from .request import Request, RequestStatus
from .scheduler_config import SchedulerConfig, SchedulerStats


class KvLoads:
    """`attach_offload`, `attach_pulls`, `_land`, `_load`, `_pull` (see the module
    docstring)."""

    config: SchedulerConfig
    kv: KVCacheManager
    waiting: WaitingQueue
    requests: dict[str, Request]
    stats: SchedulerStats
    offload: HostKvTier | None
    pulls: RemotePulls | None  # P/D: the NIXL connector's pulls (None without one)
    loaders: list[HostKvTier | RemotePulls]  # those of the two attached (read every step)
    landed: set[str]  # ids of waiting requests holding the KV a load brought
    load_blocked: str | None  # the head whose load the device could not hold at admission
    has_connector: bool  # a KV connector is configured (its counters count every admission)
    now: float  # the start of the step being scheduled (emulated seconds)

    def attach_offload(self, tier: HostKvTier) -> None:
        """Give the scheduler a CPU tier: every full block the device cache is offered is
        stored there too, and admissions look it up."""
        self.offload = tier
        self.loaders.append(tier)
        self.kv.host = tier
        self.has_connector = True

    def attach_pulls(self, pulls: RemotePulls) -> None:
        """Give the scheduler the NIXL connector's pulls (a decode pod)."""
        self.pulls = pulls
        self.loaders.append(pulls)
        self.has_connector = True

    @property
    def num_loading(self) -> int:
        return sum(len(x.loads) for x in self.loaders)

    def kv_fetch_stages(self) -> tuple[int, int, int]:
        """vLLM's async KV loads by stage (KV_FETCH_STAGES), as far as this scheduler sees
        them: a pull not started and a CPU-tier load the device could not hold yet
        (waiting_to_start), loads in flight (in_progress), and waiting requests holding what a
        load brought (completed_waiting). A NIXL pull whose prefill pod has not answered yet
        is the engine loop's (it joins the scheduler then)."""
        blocked = self.load_blocked
        start = int(blocked is not None and blocked in self.requests)
        if self.pulls is not None:
            start += len(self.pulls.expected)
        return start, self.num_loading, len(self.landed)

    def next_load_end(self) -> float | None:
        """When the next load lands (None: none in flight): the engine loops wake the core
        then when nothing else is left to schedule."""
        return min((t for x in self.loaders if (t := x.next_ready()) is not None),
                   default=None)

    def _land(self, now: float) -> None:
        """The loads that ended by `now`: their tokens are computed, cached on the device, and
        their requests wait at the front of the queue, behind those that landed before them
        (first to land, first in line)."""
        loads: list[Load] = [ld for x in self.loaders for ld in x.landed(now)]
        for load in sorted(loads, key=lambda ld: ld.ready_at):  # (ties: in order)
            req = load.req
            req.num_computed_tokens += load.num_tokens
            self.kv.cache_blocks(req)
            req.status = RequestStatus.PREEMPTED if req.num_preemptions else \
                RequestStatus.WAITING
            self.waiting.add_landed(req, self.landed)
            self.landed.add(req.request_id)

    def _load(self, req: Request, match: PrefixMatch) -> bool | None:
        """Start loading `req`'s prefix past its device `match` from the tier: True (it left
        the queue), False (the tier has nothing past the match: admit it as usual) or None
        (the device cannot hold it: stop admitting, as a failed allocation does)."""
        assert self.offload is not None
        hit = self.offload.lookup(req, match.num_tokens)
        if hit is None:
            return False
        if self._load_cap_reached():  # vLLM 0.34.0: it waits at the head of the queue
            return None
        n = hit.num_tokens - match.num_tokens
        # blocks for the whole prompt, not only the loaded part (vLLM allocates the rest at
        # its admission after the load): requests holding loaded blocks could otherwise fill
        # the pool with nothing running to free it, and none could be admitted
        if not self.kv.allocate_slots(req, req.num_tokens - match.num_tokens, match):
            return None
        self.waiting.pop()
        req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        self._count_admission(req, match.num_tokens, 0, n)
        self.offload.start(req, hit, match.num_tokens, self.now)
        return True

    def _start_load(self, req: Request, match: PrefixMatch) -> bool | None:
        """At admission, start `req`'s pull (P/D) or its load from the CPU tier: True (it left
        the queue), False (none: admit it as usual) or None (the device cannot hold its
        prompt yet: stop admitting; it stays waiting_to_start)."""
        if self.pulls is not None and req.request_id in self.pulls.expected:
            return self._pull(req, match)
        if self.offload is None or not self.kv.reads_cache(req):
            return False
        loading = self._load(req, match)
        if loading is None:
            self.load_blocked = req.request_id
        return loading

    def _pull(self, req: Request, match: PrefixMatch, at_head: bool = True) -> bool | None:
        """Start `req`'s expected pull past its device `match`: True (it left the queue),
        False (the device holds all of it: the prefill pod is told, and it is admitted as
        usual) or None (the device cannot hold its prompt yet: stop admitting). `at_head`:
        `req` is the queue's head."""
        assert self.pulls is not None
        if self.pulls.expected[req.request_id] <= match.num_tokens:
            self.pulls.finish(req.request_id)
            return False
        if not self.kv.allocate_slots(req, req.num_tokens - match.num_tokens, match):
            return None
        if at_head:
            self.waiting.pop()
        else:
            self.waiting.remove(req)
        req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        load = self.pulls.start(req, match.num_tokens, self.now)
        req.num_external_tokens = load.num_tokens
        self._count_admission(req, match.num_tokens, load.num_tokens, 0)
        return True

    # -- vLLM 0.34.0's --max-num-inflight-kv-loads ----------------------------------------
    def _load_cap_reached(self) -> bool:
        """Whether `max_num_inflight_kv_loads` requests hold blocks for async loads: in flight,
        or landed and not yet running (an abort ends its load at once here, so none is left
        finishing)."""
        cap = self.config.max_num_inflight_kv_loads
        return cap is not None and self.num_loading + len(self.landed) >= cap

    def _pull_capped(self, req: Request) -> bool:
        """`req` is an expected pull past the cap: it waits where it is, and the requests
        after it that need no load may still go (vLLM's separate async_kv_waiting queue)."""
        return (self.pulls is not None and req.request_id in self.pulls.expected
                and self._load_cap_reached())

    def _start_pulls(self) -> None:
        """Once no seat or token budget is left, expected pulls still start, in queue order,
        while the cap and the device's blocks allow: a load takes neither a seat nor budget
        until its KV has arrived, so it is ready when a seat frees. The first that cannot
        start ends it (vLLM 0.34.0's loads-only admission, with the cap set)."""
        pulls = self.pulls
        if pulls is None or not pulls.expected:
            return
        for req in [r for r in self.waiting if r.request_id in pulls.expected]:
            if self._load_cap_reached() or not self._pull(req, self.kv.match(req), False):
                return

    def _end_load(self, request_id: str) -> None:
        """The request ended: its load or expected pull goes (the connector is told)."""
        for loader in self.loaders:
            loader.finish(request_id)

    def _check_loads(self, waiting: list[Request]) -> None:
        """The loads' invariants (`Scheduler.check_integrity`): a landed request is waiting,
        a loading one waits for its load, an expected pull's request waits, and the tier's
        own."""
        ids = {r.request_id for r in waiting}
        if not self.landed <= ids:
            raise AssertionError("a landed request is not waiting")
        if self.pulls is not None and not set(self.pulls.expected) <= ids:
            raise AssertionError("an expected pull's request is not waiting")
        if self.offload is not None:
            self.offload.check_integrity()
        if any(ld.req.status != RequestStatus.WAITING_FOR_REMOTE_KVS
               for x in self.loaders for ld in x.loads.values()):
            raise AssertionError("a load's request is not waiting for it")

    def _count_admission(self, req: Request, device_hit: int, transferred: int,
                         loaded: int) -> None:
        """vLLM's prefix-cache counters at a request's admission: the device cache's, and,
        with a KV connector configured (`has_connector`: NIXL, the CPU tier or both), the
        connector's: every admission queries it for its tokens past the device hit (vLLM's
        `connector_prefix_cache_queries`); hits are the tokens `transferred` over NIXL or
        `loaded` from the CPU tier. Without the prefix cache, or for a request that reads
        nothing from it (`skip_reading_prefix_cache`), nothing is looked up and the device's
        counters stay (vLLM 0.33.0
        `KVCacheManager.record_prefix_cache_stats`)."""
        st = self.stats
        if self.kv.reads_cache(req):
            st.prefix_cache_queries += req.num_tokens
            st.prefix_cache_hits += device_hit
        if self.has_connector:
            st.external_prefix_cache_queries += req.num_tokens - device_hit
            st.external_prefix_cache_hits += transferred + loaded
            st.host_prefix_cache_hits += loaded
        if req.num_cached_tokens < 0:  # first admission: what usage reports
            req.num_cached_tokens = device_hit + transferred + loaded
