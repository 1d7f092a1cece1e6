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
from server.ipc.messages import DeploymentInfo
from server.stats.layout import HistogramWriter, Layout
from server.stats.schema import STATE_CODES, compile_reason, engine_metrics
from server.stats.shm import StatsFile


class EngineStats:
    def __init__(self, path: Path, info: DeploymentInfo, epoch: int, pid: int) -> None:
        self.info = info
        self.layout = layout = Layout(engine_metrics(info))
        self.file = StatsFile(path, layout.size, create=True)
        self.a = self.file.values
        self.slot = layout.slot
        self.iteration_tokens = HistogramWriter(self.a, layout, "vllm:iteration_tokens_total")
        self.step_seconds = HistogramWriter(self.a, layout, "doppelchip_step_seconds")
        self._tier_slots = {t: layout.slot("doppelchip_tier_bytes", t) for t in info.tiers}
        self._seen = (0, 0, 0)  # scheduler's preemptions, prefix queries, prefix hits
        self._kv_used = -1
        f = self.file
        f.begin()
        self.a[self.slot("_epoch")] = epoch
        self.a[self.slot("_pid")] = pid
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                     "doppelchip_realtime_lag_seconds", "_kv_used"):
            self.a[self.slot(name)] = 0
        self.a[self.slot("_kv_free")] = info.capacity.kv_blocks_total
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

    def queued(self, num_queued: int) -> None:
        self.file.begin()
        self.a[self.slot("vllm:num_requests_waiting")] = num_queued
        self.file.end()

    def startup(self, seconds: float) -> None:
        """A cold start's build/compile time, as a compile event."""
        if seconds > 0:
            self.file.begin()
            self.a[self.slot("doppelchip_compile_events", "cold_start")] += 1
            self.a[self.slot("doppelchip_compile_seconds", "cold_start")] += seconds
            self.file.end()

    def step(self, core: EngineCore, result: StepResult, lag: float, t: float,
             num_queued: int) -> None:
        a, slot, sched = self.a, self.slot, core.scheduler
        cost, n = result.cost, result.micro_batches  # `cost` is one micro-batch's
        busy = max(0.0, result.seconds - result.stall_s)
        self.file.begin()
        self._gauges(core, num_queued, lag, t)
        a[slot("_idle")] = 0
        a[slot("_steps")] += 1
        a[slot("_generated")] += sum(len(t) for t in result.new_tokens.values())
        st = sched.stats
        seen = (st.num_preemptions, st.prefix_cache_queries, st.prefix_cache_hits)
        for name, now, before in zip(("vllm:num_preemptions", "vllm:prefix_cache_queries",
                                      "vllm:prefix_cache_hits"), seen, self._seen, strict=True):
            a[slot(name)] += now - before
        self._seen = seen
        self.iteration_tokens.observe(result.output.num_batched_tokens)
        self.step_seconds.observe(result.seconds)
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

    def resume(self) -> None:
        """Energy and cost continue from what an earlier incarnation of this engine spent."""
        self._base_joules = self.a[self.slot("doppelchip_energy_joules")]
        self._base_dollars = self.a[self.slot("doppelchip_cost_dollars")]

    def idle(self, core: EngineCore, num_queued: int, t: float) -> None:
        """Nothing runs: lag 0 (the EmulationLagging alert must clear), energy accounted up to
        `t`, from where the reader extrapolates idle power until it scrapes."""
        self.file.begin()
        self._gauges(core, num_queued, 0.0, t)
        self.a[self.slot("_idle")] = 1
        self.a[self.slot("doppelchip_energy_joules")] = core.stats.joules + self._base_joules
        self.a[self.slot("doppelchip_cost_dollars")] = core.stats.dollars + self._base_dollars
        self.file.end()

    def _gauges(self, core: EngineCore, num_queued: int, lag: float, t: float) -> None:
        a, slot, sched = self.a, self.slot, core.scheduler
        a[slot("vllm:num_requests_running")] = sched.num_running
        a[slot("vllm:num_requests_waiting")] = num_queued
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
