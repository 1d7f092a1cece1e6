"""The scheduler (vLLM v1 style): one token budget per step, prefill and decode alike.

Contract: the engine loop alternates ``schedule()`` → (device step, model sampling) →
``update(output, sampled_tokens)``; ``add_request``, ``abort`` and ``preempt`` may come in
between steps. The scheduler owns the requests, the waiting queue, the running list, the
block pool and the prefix cache; it is the only writer of all of them.

Each ``schedule()``: running requests first, in order (decodes and continuing prefill chunks),
preempting by recompute when their next tokens find no KV block (the policy's victim — the
newest under FCFS — loses its blocks, its computed full blocks stay in the prefix cache, and
it goes back to the front of the waiting queue); then, if nobody was preempted, waiting
requests in policy order, each continuing from its cached prefix, with chunked prefill,
until the token budget, the sequence cap or the KV pool runs out. Static batching admits
only when nothing runs.
"""

from __future__ import annotations

from .block_pool import BlockPool
from .kv_hold import KvHold
from .kv_loads import KvLoads
from .kv_manager import KVCacheManager, NoKVCacheManager
from .lora_budget import lora_budget
from .policy import make_queue
from .prefix_cache import NoPrefixCache, PrefixCache
from .radix_cache import RadixCache
from .request import FinishReason, Request, RequestStatus
from .scheduler_config import (
    ScheduledRequest,
    SchedulerConfig,
    SchedulerOutput,
    SchedulerStats,
    draft_tokens,
    long_prefill_cap,
    scheduled_entry,
)
from .scheduler_update import StepUpdate

# ScheduledRequest(...) without the NamedTuple's Python-level __new__ (one per request per
# step): the fields in order, num_draft_tokens included
_new = tuple.__new__


class Scheduler(KvHold, KvLoads, StepUpdate):
    def __init__(self, config: SchedulerConfig, eos_token_id: int | None = None) -> None:
        self.config = config
        self.eos_token_id = eos_token_id
        self.pool = BlockPool(config.num_blocks, config.block_size)
        self.cache: PrefixCache = (
            RadixCache(self.pool) if config.enable_prefix_caching else NoPrefixCache(self.pool)
        )
        self.kv = (KVCacheManager if config.kv_cache else NoKVCacheManager)(
            self.pool, self.cache, kv_layout=config.kv_layout, max_model_len=config.max_model_len
        )
        self.waiting = make_queue(config.policy, config.lpm_fcfs_threshold)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}  # every unfinished request, by id
        self.stats = SchedulerStats()
        # --- P/D (issue 13): KV kept for a decode side to read (vLLM's delay_free_blocks) ---
        self.held: dict[str, tuple[list[int], object]] = {}  # request id -> (blocks, node)
        self.paused_new = False  # vLLM's PauseState.PAUSED_NEW: no waiting request is admitted
        # --- the CPU offloading tier (kv_loads.py): None without --kv-offloading-size ---
        self.offload = None
        self.pulls = None  # P/D: the NIXL connector's pulls (kv_pulls.py), on a decode pod
        self.loaders = []  # the attached ones of the two (kv_loads.py)
        self.landed: set[str] = set()
        self.load_blocked: str | None = None  # the last admission's head whose load could not
        #                                       start (no room on the device): waiting_to_start
        self.now = 0.0
        self.has_connector = False  # a KV connector is configured (build_core sets it)

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        """Queued requests, those loading from the CPU tier included (as vLLM counts them)."""
        return len(self.waiting) + self.num_loading

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def free_seats(self) -> int:
        """Batch seats (`max_num_seqs`) no running request holds."""
        return max(0, self.config.max_num_seqs - len(self.running))

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # -- requests in and out ---------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        """Queue a new request. Raises ValueError if it could never run here."""
        cfg = self.config
        if req.request_id in self.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        room = cfg.max_model_len if req.pooling else cfg.max_model_len - 1  # (pooling fills it)
        if req.num_prompt_tokens > room:
            raise ValueError(
                f"prompt has {req.num_prompt_tokens} tokens; max_model_len is {cfg.max_model_len}"
            )
        if (need := self.kv.blocks_needed_alone(req)) > cfg.num_blocks:
            raise ValueError(f"request needs {need} KV blocks; the pool has {cfg.num_blocks}")
        req.status = RequestStatus.WAITING
        self.requests[req.request_id] = req
        self.waiting.add(req)
        if req.num_remote_tokens and self.pulls is not None:
            self.pulls.expect(req.request_id, req.num_remote_tokens)

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> Request | None:
        """End a waiting, preempted or running request now and free all its KV references.
        Returns it, or None if it is unknown or already finished."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
            self._end_load(request_id)
        else:
            self.waiting.remove(req)
            self.landed.discard(request_id)
            if self.pulls is not None:
                self.pulls.finish(request_id)  # a pull not started: the prefill pod is told
        self.kv.free(req, cache=False)
        req.status, req.finish_reason = RequestStatus.for_reason(reason), reason
        self.stats.num_aborted += 1
        return req

    def preempt(self, request_id: str) -> bool:
        """Force a running request back to the waiting queue (tests, operators)."""
        req = self.requests.get(request_id)
        if req is None or req.status != RequestStatus.RUNNING:
            return False
        self._preempt(req)
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.free(req, cache=True)
        req.num_computed_tokens = 0
        req.num_external_tokens = 0  # transferred KV is gone: recomputed locally (as vLLM)
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.add_preempted(req)

    # -- one step --------------------------------------------------------------------------
    def cache_aware(self) -> bool:
        """Whether this step admits the plain waiting requests of its window deepest cached
        prefix first (vLLM 0.34.0's cache-aware admission: FCFS, prefix caching, the KV usage
        at least its threshold)."""
        cfg = self.config
        return (cfg.cache_aware_admission_window > 0 and cfg.policy == "fcfs"
                and self.cache.enabled and len(self.waiting) > 1
                and self.kv.usage >= cfg.cache_aware_admission_threshold)

    def schedule(self, now: float | None = None) -> SchedulerOutput:
        """One step's batch; `now` is the step's start (emulated seconds; default: the last
        one given), which the CPU tier's loads are timed on."""
        cfg, kv = self.config, self.kv
        if now is not None:
            self.now = now
        if self.loaders and self.num_loading:
            self._land(self.now)
        budget = cfg.max_num_batched_tokens
        scheduled: dict[str, ScheduledRequest] = {}
        preempted: list[str] = []
        static_locked = cfg.batching == "static" and bool(self.running)
        self.stats.num_lora_deferred = 0

        bs, paged, speculates = kv.block_size, not kv.contiguous, cfg.num_speculative_tokens > 0
        plain = paged and not speculates  # a decode may take the fast path below
        running = self.running  # the one list: _preempt removes from it in place
        cap = long_prefill_cap(cfg, len(running) + len(self.waiting), budget)
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed = req.num_computed_tokens
            remaining = len(req.token_ids) - computed
            if (remaining == 1 and plain and computed >= req.num_prompt_tokens
                    and computed < len(req.block_ids) * bs):
                # a plain decode into a block it holds (what the general path below does)
                rid = req.request_id
                scheduled[rid] = _new(ScheduledRequest, (rid, 1, computed, False, True, 0))
                if (computed + 1) // bs * bs > req._tree_len:  # completes a block: cache it
                    kv.cache_blocks(req, computed + 1)
                budget -= 1
                i += 1
                continue
            if not cfg.enable_chunked_prefill and remaining > budget:
                i += 1  # a whole prefill that does not fit this step waits for the next
                continue
            num_new = min(remaining, cap, budget)
            drafts = draft_tokens(cfg, req, num_new, budget) if speculates else 0
            end = computed + num_new
            if paged and end + drafts <= len(req.block_ids) * bs:  # fits the blocks it holds
                scheduled[req.request_id] = scheduled_entry(req, num_new, drafts)
                if end // bs * bs > req._tree_len:  # completes a block: offer it to the cache
                    kv.cache_blocks(req, end)
                budget -= num_new + drafts
                i += 1
                continue
            while not kv.allocate_slots(req, num_new + drafts):
                victim = self.waiting.choose_victim(self.running)
                if self.running.index(victim) < i:  # already scheduled this step: undo that
                    undone = scheduled.pop(victim.request_id, None)
                    budget += undone.num_new_tokens if undone else 0
                    i -= 1
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            else:
                scheduled[req.request_id] = scheduled_entry(req, num_new, drafts)
                kv.cache_blocks(req, req.num_computed_tokens + num_new)
                budget -= num_new + drafts
                i += 1

        if not preempted and not static_locked and not self.paused_new:
            self.waiting.prepare(self.cache)
            if self.cache_aware():
                self.waiting.cache_aware_reorder(cfg.cache_aware_admission_window,
                                                 self.kv.num_cached_tokens)
            # --- LoRA (issue 13): vLLM v1's max_loras rule (see lora_budget) ---
            loras = lora_budget(cfg.max_loras, self.running, scheduled)
            skipped: list[Request] = []  # wait where they are; later requests may go
            lora_skips = 0
            self.load_blocked = None
            loads_only = True  # whether pulls may still start once the seats or budget run out
            while self.waiting and len(self.running) < cfg.max_num_seqs:
                req = self.waiting.peek()
                if loras is not None and not loras.admits(req.lora_id):
                    skipped.append(self.waiting.pop())
                    lora_skips += 1
                    continue
                if self._pull_capped(req):  # past max_num_inflight_kv_loads
                    skipped.append(self.waiting.pop())
                    continue
                match = kv.match(req)
                resumed = req.request_id in self.landed  # holds what a load brought
                if not resumed and (self.offload is not None or self.pulls is not None):
                    loading = self._start_load(req, match)
                    if loading is None:
                        loads_only = False
                        break
                    if loading:
                        continue
                remaining = req.num_tokens - req.num_computed_tokens - match.num_tokens
                if not cfg.enable_chunked_prefill and remaining > budget:
                    loads_only = False
                    if cfg.batching != "static":
                        break
                    remaining = 0  # static: admit into the batch now, prefill in a later step
                num_new = min(remaining, cap, budget)
                if num_new == 0 and cfg.batching != "static":
                    break
                if not kv.allocate_slots(req, num_new, match):
                    loads_only = False
                    break
                self.waiting.pop()
                req.status = RequestStatus.RUNNING
                self.running.append(req)
                if resumed:  # counted when its load started
                    self.landed.discard(req.request_id)
                else:
                    self._count_admission(req, match.num_tokens, 0, 0)
                if num_new:
                    scheduled[req.request_id] = scheduled_entry(req, num_new)
                    kv.cache_blocks(req, req.num_computed_tokens + num_new)
                    budget -= num_new
                if loras is not None:
                    loras.add(req.lora_id)
            for req in reversed(skipped):  # back at the head, in their order
                self.waiting.add_preempted(req)
            self.stats.num_lora_deferred = lora_skips
            if loads_only and cfg.max_num_inflight_kv_loads is not None:
                self._start_pulls()  # seats or budget ran out: pulls may still start

        if scheduled:  # (a pass that only starts KV loads runs no step)
            self.stats.num_steps += 1
        self.stats.peak_num_running = max(self.stats.peak_num_running, len(self.running))
        return SchedulerOutput(tuple(scheduled.values()), tuple(preempted))

    # -- invariants ------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Pool, cache and bookkeeping invariants (AssertionError if any is broken)."""
        self.kv.check_integrity(list(self.requests.values()),
                                held=[b for b, _ in self.held.values()],
                                lookahead=self.config.num_speculative_tokens)
        waiting = list(self.waiting)
        if len(waiting) + len(self.running) + self.num_loading != len(self.requests):
            raise AssertionError("a request is lost or in two places")
        for r in waiting:  # (a landed one holds the KV its load brought until admitted)
            if r.request_id not in self.landed and (
                    r.block_ids or r.cache_node is not None or r.num_computed_tokens):
                raise AssertionError(f"waiting {r} holds KV")
        self._check_loads(waiting)
        if any(r.status != RequestStatus.RUNNING for r in self.running):
            raise AssertionError("a non-running request is in the running list")

