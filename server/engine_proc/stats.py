"""The engine core's side of the metrics: one write of its stats array per step.

Scheduler gauges (running, waiting, KV), prefix-cache and preemption counters, iteration
tokens, device counters (bytes per tier, FLOPs, bound, compiles), energy and cost, the lag
gauge, and the internal status slots (`_state`, `_epoch`, ...) front ends read for
`ListDeployments` and health. The file outlives the process, so counters continue across an
engine restart (they are only ever incremented).
"""

from __future__ import annotations

from pathlib import Path

from server.engine.core import EngineCore, StepResult
from server.engine_proc.stats_connectors import ConnectorStats
from server.ipc.deployment import DeploymentInfo
from server.stats.layout import HistogramWriter, Layout
from server.stats.schema import (
    KV_FETCH_STAGES,
    KV_RESIDENCY,
    STATE_CODES,
    compile_reason,
    engine_metrics,
)
from server.stats.shm import StatsFile


class EngineStats(ConnectorStats):
    def __init__(self, path: Path, info: DeploymentInfo, epoch: int, pid: int) -> None:
        self.info = info
        self.layout = layout = Layout(engine_metrics(info))
        self.file = StatsFile(path, layout.size, create=True)
        self.a = self.file.values
        self.slot = layout.slot
        self.iteration_tokens = HistogramWriter(self.a, layout, "vllm:iteration_tokens_total")
        self.step_seconds = HistogramWriter(self.a, layout, "doppelchip_step_seconds")
        self.residency = tuple(HistogramWriter(self.a, layout, name) for name in KV_RESIDENCY
                               ) if info.kv_cache_metrics else ()  # --kv-cache-metrics
        self._tier_slots = {t: layout.slot("doppelchip_tier_bytes", t) for t in info.tiers}
        self._seen = (0, 0, 0)  # scheduler's preemptions, prefix queries, prefix hits
        self._init_connectors(info, layout)
        self._spec_seen: tuple[int, ...] = ()
        # the draft passes' share of the busy time (TensorRT-LLM's draft overhead)
        self._draft_slot = layout.slot("_draft_seconds") if info.num_speculative_tokens else -1
        self._per_gpu = 1.0 / max(1, info.chip_count)
        self._kv_used = -1
        self._fetch_slots = tuple(layout.slot("vllm:num_requests_kv_fetch_by_stage", stage)
                                  for stage in KV_FETCH_STAGES) if info.kv_consumer else ()
        f = self.file
        f.begin()
        self.a[self.slot("_epoch")] = epoch
        self.a[self.slot("_pid")] = pid
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                     "doppelchip_realtime_lag_seconds", "_kv_used",
                     "_paused", "_ft_status", "_ft_pushes"):
            self.a[self.slot(name)] = 0
        for i in self._fetch_slots:
            self.a[i] = 0
        self.a[self.slot("_kv_free")] = info.capacity.kv_blocks_total
        for state in ("awake", "weights_offloaded", "discard_all"):
            self.a[self.slot("vllm:engine_sleep_state", state)] = float(state == "awake")
        f.end()
        self.resume()

    def set_state(self, state: str, message: str, t: float | None = None) -> None:
        f = self.file
        f.begin()
        self.a[self.slot("_state")] = STATE_CODES.index(state)
        if t is not None:
            self.a[self.slot("_t")] = t
        f.set_text(message)
        f.end()

    def paused(self, paused: bool) -> None:
        """Whether vLLM's /pause holds this engine (an internal slot: `/is_paused` reads it;
        vLLM exports no pause metric, and every scrape would carry one more series)."""
        self.file.begin()
        self.a[self.slot("_paused")] = float(paused)
        self.file.end()

    def fault_status(self, status: int, pushes: int) -> None:
        """Fault tolerance's status (an index of `sentinel.STATUSES`) and how many times it
        was pushed (internal slots: `/v1/fault_tolerance/status` reads them)."""
        self.file.begin()
        self.a[self.slot("_ft_status")] = status
        self.a[self.slot("_ft_pushes")] = pushes
        self.file.end()

    def queued(self, num_queued: int, rejected: dict[str, int] | None = None) -> None:
        """Admissions happened: the waiting count now, and the requests a queue limit refused,
        by vllm:admission_rejections' reason."""
        self.file.begin()
        self._waiting(num_queued)
        for reason, n in (rejected or {}).items():
            self.a[self.slot("vllm:admission_rejections", reason)] += n
        self.file.end()

    def _waiting(self, num_queued: int, deferred: int = 0) -> None:
        a, slot = self.a, self.slot
        deferred = min(deferred, num_queued)  # --- LoRA (issue 13): skipped for max_loras ---
        a[slot("vllm:num_requests_waiting")] = num_queued
        a[slot("vllm:num_requests_waiting_by_reason", "capacity")] = num_queued - deferred
        a[slot("vllm:num_requests_waiting_by_reason", "deferred")] = deferred

    def startup(self, seconds: float) -> None:
        """A cold start's build/compile time, as a compile event."""
        if seconds > 0:
            self.file.begin()
            self.a[self.slot("doppelchip_compile_events", "cold_start")] += 1
            self.a[self.slot("doppelchip_compile_seconds", "cold_start")] += seconds
            self.file.end()

    def step(self, core: EngineCore, result: StepResult, lag: float, t: float,
             num_queued: int, fetch: tuple[int, int, int]) -> None:
        a, slot, sched = self.a, self.slot, core.scheduler
        cost, n = result.cost, result.micro_batches  # `cost` is one micro-batch's
        busy = max(0.0, result.seconds - result.stall_s)
        # the step that finished the last request leaves the deployment idle from `t`: it is
        # written so in the same write (a client that has its last token and scrapes must not
        # find a stale lag, nor the idle-power extrapolation waiting for the loop's next turn)
        idle = not core.has_unfinished()
        self.file.begin()
        self._gauges(core, num_queued, fetch, 0.0 if idle else lag, t)
        a[slot("_idle")] = int(idle)
        a[slot("_steps")] += 1
        a[slot("_generated")] += sum(len(t) for t in result.new_tokens.values())
        st = sched.stats
        seen = (st.num_preemptions, st.prefix_cache_queries, st.prefix_cache_hits)
        for name, now, before in zip(("vllm:num_preemptions", "vllm:prefix_cache_queries",
                                      "vllm:prefix_cache_hits"), seen, self._seen, strict=True):
            a[slot(name)] += now - before
        a[slot("vllm:prompt_tokens_cached_by_source", "device")] += seen[2] - self._seen[2]
        self._seen = seen
        self.iteration_tokens.observe(iteration_tokens(result, sched))
        per_gpu = self._per_gpu
        a[slot("vllm:estimated_flops_per_gpu")] += cost.flops * n * per_gpu
        a[slot("vllm:estimated_read_bytes_per_gpu")] += cost.bytes * n * per_gpu
        a[slot("vllm:estimated_write_bytes_per_gpu")] += (
            result.output.num_batched_tokens * self.info.kv_bytes_per_token * per_gpu)
        if self.info.num_speculative_tokens:
            self._spec(core)
            if cost.seconds > 0:
                a[self._draft_slot] += busy * cost.draft_s / cost.seconds
        self.step_seconds.observe(result.seconds)
        if self.residency:
            self._residency(core)
        a[slot("doppelchip_busy_seconds")] += busy
        a[slot("doppelchip_bound_seconds", cost.bound)] += busy
        a[slot("doppelchip_flops")] += cost.flops * n
        for tier, b in cost.bytes_by_tier:
            if (at := self._tier_slots.get(tier)) is not None:
                a[at] += b * n
            if tier == "ssd":
                a[slot("doppelchip_ssd_page_in_bytes")] += b * n
        if result.stall_reason is not None:
            reason = compile_reason(result.stall_reason)
            a[slot("doppelchip_compile_events", reason)] += 1
            a[slot("doppelchip_compile_seconds", reason)] += result.stall_s
            a[slot("doppelchip_pipeline_idle_seconds")] += result.stall_s
        if result.jump_forward:
            a[slot("doppelchip_jump_forward_tokens")] += sum(result.jump_forward.values())
        a[slot("doppelchip_energy_joules")] = core.stats.joules + self._base_joules
        a[slot("doppelchip_cost_dollars")] = core.stats.dollars + self._base_dollars
        self.file.end()

    def _residency(self, core: EngineCore) -> None:
        """vLLM's KV residency histograms, from the blocks the pool's sampler saw evicted
        (server/engine/kv_metrics.py); called inside an open write."""
        metrics = core.scheduler.pool.metrics
        events = metrics.drain_events() if metrics is not None else ()
        if events:
            lifetime, idle, reuse = self.residency
            lifetime.observe_many([e.lifetime_seconds for e in events])
            idle.observe_many([e.idle_seconds for e in events])
            reuse.observe_many([g for e in events for g in e.reuse_gaps_seconds])

    def resume(self) -> None:
        """Energy and cost continue from what an earlier incarnation of this engine spent."""
        self._base_joules = self.a[self.slot("doppelchip_energy_joules")]
        self._base_dollars = self.a[self.slot("doppelchip_cost_dollars")]

    def idle(self, core: EngineCore, num_queued: int, fetch: tuple[int, int, int],
             t: float) -> None:
        """Nothing runs: lag 0 (the EmulationLagging alert must clear), energy accounted up to
        `t`, from where the reader extrapolates idle power until it scrapes."""
        self.file.begin()
        self._gauges(core, num_queued, fetch, 0.0, t)
        self.a[self.slot("_idle")] = 1
        self.a[self.slot("doppelchip_energy_joules")] = core.stats.joules + self._base_joules
        self.a[self.slot("doppelchip_cost_dollars")] = core.stats.dollars + self._base_dollars
        self.file.end()

    def _spec(self, core: EngineCore) -> None:
        """vLLM's spec-decode counters, from the core's own (deltas: they restart at 0)."""
        st = core.stats
        now = (st.spec_num_drafts, st.spec_num_draft_tokens, st.spec_num_accepted_tokens,
               *st.spec_num_accepted_tokens_per_pos)
        before = self._spec_seen or (0,) * len(now)
        a, slot = self.a, self.slot
        for name, i in (("vllm:spec_decode_num_drafts", 0),
                        ("vllm:spec_decode_num_draft_tokens", 1),
                        ("vllm:spec_decode_num_accepted_tokens", 2)):
            a[slot(name)] += now[i] - before[i]
        for pos in range(len(now) - 3):
            a[slot("vllm:spec_decode_num_accepted_tokens_per_pos", str(pos))] += (
                now[3 + pos] - before[3 + pos])
        self._spec_seen = now

    def _gauges(self, core: EngineCore, num_queued: int, fetch: tuple[int, int, int],
                lag: float, t: float) -> None:
        """`fetch`: the async KV loads by stage (KV_FETCH_STAGES; `EngineLoop.kv_fetch`)."""
        a, slot, sched = self.a, self.slot, core.scheduler
        a[slot("vllm:num_requests_running")] = sched.num_running
        # deferred: skipped for max_loras, or a KV load started and the request not yet running
        # (vLLM's deferred_waiting holds it from the load's start until it is scheduled)
        self._waiting(num_queued, sched.stats.num_lora_deferred + fetch[1] + fetch[2])
        if self._fetch_slots:  # (only where vLLM registers the gauge)
            for i, n in zip(self._fetch_slots, fetch, strict=True):
                a[i] = n
        a[slot("doppelchip_realtime_lag_seconds")] = lag
        a[slot("_t")] = t
        free = sched.pool.num_free + sched.cache.evictable_blocks
        used = sched.config.num_blocks - free
        a[slot("_kv_free")] = free
        a[slot("_kv_used")] = used
        if used != self._kv_used:
            self._kv_used = used
            p, bs = core.placement, sched.config.block_size
            resident = dict(zip(self.info.tiers, self.info.weights_resident, strict=True))
            for tier, b in p.memory_bytes(used * bs).items():
                if tier in resident:
                    a[slot("doppelchip_kv_resident_bytes", tier)] = max(
                        0.0, b - resident[tier])


def iteration_tokens(result: StepResult, sched) -> int:
    """vLLM's vllm:iteration_tokens_total for one step: the tokens generated, plus the prompt
    tokens computed (not served from the cache) of the requests that got their first token in
    it — not the scheduled tokens (a chunked prefill counts at its last chunk)."""
    generated = prompt = 0
    done = {r.request_id: r for r in result.finished}
    for rid, tokens in result.new_tokens.items():
        generated += len(tokens)
        req = sched.requests.get(rid) or done.get(rid)
        if req is not None and req.num_output_tokens == len(tokens):
            prompt += req.num_prompt_tokens - max(req.num_cached_tokens, 0)
    return generated + prompt

