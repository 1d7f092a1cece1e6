"""The engine loop's work outside its steps (issue 13), as a mixin of `EngineLoop`
(server/engine_proc/loop.py), which owns every attribute used here: publishing the prefix
cache's KV events and resetting it; sleep mode (sleep, wake-up and its emulated cost);
pausing generation (`loop_pause.py`); P/D's timers (KV holds expiring, transfers ending) and how
an idle engine waits for them.

Why a mixin: these are the same single writer's state changes (one engine loop per rank),
kept out of `loop.py` so that the step loop reads on its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from server.engine.interface import FinishReason
from server.engine.request import Request
from server.engine_proc.checkpoint import LoopCheckpoint
from server.engine_proc.loop_pause import LoopPause
from server.engine_proc.profiler import ProfilerAlreadyActive
from server.engine_proc.sleep import LEVELS, MODES
from server.ipc import messages as m

log = logging.getLogger("doppelchip.engine")


@dataclass(eq=False)
class Live:
    """A request the engine loop holds, with whom to answer."""

    req: Request
    frontend: int
    seq: int
    rid: str  # the client's request id, for logs
    scheduled: bool = False


class LoopControls(LoopPause, LoopCheckpoint):
    """EngineLoop's KV-event, sleep-mode and P/D methods (see the module docstring)."""

    # --- KV events (issue 13) ---
    def _publish_kv_events(self) -> None:
        """One batch of what the cache did since the last one (none when it did nothing)."""
        if self.kv_log is not None and self.kv_log.events:
            events = self.kv_log.take()
            if self.kv_pub is not None:
                self.kv_pub.publish(events)

    def _reset_prefix_cache(self, msg: m.ResetPrefixCache) -> None:
        """vLLM's reset_prefix_cache: refused while a request holds blocks, unless
        `reset_running` preempts the running ones first (they recompute, as vLLM's)."""
        sched = self.core.scheduler
        if msg.reset_running:
            while sched.running:  # from the back: they return to the queue in their order
                sched.preempt(sched.running[-1].request_id)
        reset = getattr(sched.cache, "reset", None)
        ok = bool(reset()) if reset is not None else False
        if msg.reset_external and sched.offload is not None:  # vLLM's reset_connector
            ok = sched.offload.reset() and ok
        log.info("prefix cache reset on %s (rank %d): %s", self.name, self.rank,
                 "done" if ok else "refused, requests hold blocks")
        self._publish_kv_events()
        self._send(msg.frontend, m.encode(m.CacheReset(self.deployment, self.rank, msg.token,
                                                       ok)))
    # --- end KV events ---

    # ---- P/D and sleep mode (issue 13) ------------------------------------------------------
    def _tick(self) -> None:
        """Due replies (a wake-up answers once its weights are back), expired KV holds, and
        KV transfers that ended: their requests join the scheduler (or end, policy fail)."""
        now = self.now()
        t = max(self._t, now)
        # a reply is due when the timeline reaches it (not `_t`: a wake-up moves `_t` to its end)
        for timer in [x for x in self.timers if x[0] <= now]:
            self.timers.remove(timer)
            self._send(timer[1], m.encode(m.Admissions(self.deployment, self.rank,
                                                       [m.Admission(timer[2])])))
        if self.connector is None:
            return
        self.connector.expire(t)
        for tr in self.connector.ready():
            live = tr.live
            if live.req.request_id not in self.live:
                continue
            if tr.failed and self.connector.config.kv_load_failure_policy == "fail":
                self._end_now(live, FinishReason.ERROR)
                continue
            self.inbox.append(live)  # (after a failed read: prefilled here, as vLLM's recompute)

    def _idle(self) -> None:
        """Nothing to step: block for a message, or until the next emulated deadline (a hold's
        expiry, a wake-up's reply; a KV load's end is the core's), which the timeline then reaches
        exactly (not at the wall clock's later reading)."""
        times = [t for t, _, _ in self.timers]
        if self.connector is not None and (d := self.connector.next_deadline()) is not None:
            times.append(d)
        if (d := self.core.next_deadline()) is not None:  # a load from the CPU tier ends
            times.append(d)
        deadline = min(times, default=None)
        fault_ms = self._idle_timeout_ms()  # failure injection: the next fault event
        if deadline is None:
            self._service(fault_ms)
            if self.inbox:  # only an arrival moves the timeline (see _resync)
                self._resync()
            return
        wall = self.timeline.wall_until(deadline)
        if wall > 0:
            timeout = max(1, int(wall * 1000))
            self._service(timeout if fault_ms is None else min(timeout, fault_ms))
        if self.inbox:
            self._resync()
        elif self.timeline.wall_until(deadline) <= 0:
            self._idle_until(deadline)

    def _end_now(self, live: Live, reason: FinishReason) -> None:
        """End a request outside a step (sleep's abort, a failed KV load): tell its front end.
        It ends now (an idle timeline stays at its last step's end until an arrival)."""
        t = max(self._t, self.now())
        self._send(live.frontend, m.encode(m.StepOutputs(
            self.deployment, self.rank, self.epoch, self.step_no, t, t, [], [], [],
            [], [], [m.Finished(live.seq, reason.value)], weight_version=self.weight_version)))
        self._forget(live, reason)

    def _fault_tolerance(self, msg: m.FaultTolerance) -> m.Admission:
        """vLLM's fault-tolerance instruction: applied (the status pushed before the answer, as
        vLLM's engine pushes it before its result), or refused with vLLM's reason."""
        ft = self.sentinel
        if ft is None:
            return m.Admission(msg.seq, "InvalidRequest", "fault tolerance is not enabled")
        reason = ft.handle(msg.instruction, msg.params)
        if reason is not None:
            log.warning("%s", reason)
            return m.Admission(msg.seq, "InvalidRequest", reason)
        ft.publish(self.stats)
        log.info("[FT] Engine %d status -> HEALTHY (%s, round %s)", ft.engine_index,
                 msg.instruction, msg.request_id)
        return m.Admission(msg.seq)

    def _control(self, msg: m.Sleep | m.WakeUp | m.ReleaseKvCache | m.Profile | m.WeightVersion
                 | m.FaultTolerance) -> m.Admission | None:
        """Sleep, wake up, release the KV cache or profile; the answer now, or None when it
        comes later (mode wait, or a wake-up whose weights take emulated time to come back)."""
        if isinstance(msg, m.ReleaseKvCache):
            return self._release_kv_cache(msg.seq, msg.reset_connector)
        if isinstance(msg, m.FaultTolerance):
            return self._fault_tolerance(msg)
        if isinstance(msg, m.Profile):
            return self._profile(msg)
        if isinstance(msg, m.WeightVersion):  # vLLM's weight version label (RL)
            if msg.version is not None:
                self.weight_version = msg.version
                log.info("%s weight version: %s", self.name, msg.version)
            return m.Admission(msg.seq, message=self.weight_version)
        if isinstance(msg, m.WakeUp):
            if (blocked := self._checkpoint_blocks(msg.seq, "wake_up")) is not None:
                return blocked
            seconds = self.sleep.wake(msg.tags, self.core.placement)
            if not self.sleep.sleeping and self.pause.paused:
                self._resume()  # vLLM 0.33.0: fully awake resumes the scheduler (a /pause too)
            self.stats.pd_sleep(self.core, self.sleep, self.connector)  # before the answer
            if seconds <= 0:
                return m.Admission(msg.seq)
            self._t = max(self._t, self.now()) + seconds  # no step before the weights are back
            self.timers.append((self._t, msg.frontend, msg.seq))
            log.info("%s waking up: %.3f s (emulated) to bring the weights back", self.name,
                     seconds)
            return None
        if (blocked := self._checkpoint_blocks(msg.seq, "sleep")) is not None:
            return blocked
        if msg.level not in LEVELS or msg.mode not in MODES:
            return m.Admission(msg.seq, "InvalidRequest",
                               f"sleep level must be one of {LEVELS} and mode one of {MODES}")
        if self.sleep.sleeping:
            log.warning("Executor is already sleeping.")
            return m.Admission(msg.seq)
        if msg.mode == "wait" and self.core.has_unfinished():
            self.pending_sleep = (msg.frontend, msg.seq, msg.level, msg.reset_connector)
            return None
        return self._fall_asleep(msg.level, msg.mode, msg.seq, msg.reset_connector)

    def _profile(self, msg: m.Profile) -> m.Admission:
        """vLLM's /start_profile and /stop_profile (server/engine_proc/profiler.py)."""
        if self.profiler is None:
            return m.Admission(msg.seq, "InvalidRequest", "Profiling is not enabled. Please "
                               "set --profiler-config to enable profiling.")
        if not msg.start:
            self.profiler.stop()
            return m.Admission(msg.seq)
        try:
            self.profiler.start(msg.prefix, msg.delay_iterations, msg.max_iterations)
        except ProfilerAlreadyActive as e:
            return m.Admission(msg.seq, "AlreadyExists", str(e))
        return m.Admission(msg.seq)

    def _release_kv_cache(self, seq: int, reset_connector: bool) -> m.Admission:
        """vLLM's release_kv_cache_memory: refused unless a pause is complete (mode wait: its
        running requests finished; requests it keeps queued or frozen do not count, as vLLM's
        paused scheduler counts none) and weights and KV cache are resident; then the frozen
        requests are preempted (recomputed after the wake-up: vLLM's reset_running_requests),
        the prefix cache (and with `reset_connector` the CPU tier) is emptied and the KV cache
        sleeps until a wake-up."""
        sched = self.core.scheduler
        paused = self.pause.paused or "scheduling" in self.sleep.asleep_tags
        if not paused or self.pause.waiters or (self.pause.mode == "wait" and sched.running):
            return m.Admission(seq, "InvalidRequest",
                               "release_kv_cache_memory() requires a completed pause first")
        if self.sleep.memory_asleep:
            return m.Admission(seq, "InvalidRequest", "release_kv_cache_memory() requires all "
                               "executor memory to be resident")
        while sched.running:  # from the back: they return to the queue in their order
            sched.preempt(sched.running[-1].request_id)
        self._clear_cache(reset_connector)
        self.sleep.release_kv()
        self.stats.pd_sleep(self.core, self.sleep, self.connector)
        log.info("%s released its KV cache memory", self.name)
        return m.Admission(seq)

    def _fall_asleep(self, level: int, mode: str, seq: int,
                     reset_connector: bool = True) -> m.Admission:
        sched = self.core.scheduler
        if mode == "abort":
            for live in list(self.live.values()):
                if live in self.inbox:
                    continue  # accepted, not yet started: it waits for the wake-up
                if self.connector is not None:
                    self.connector.abort(live.req.request_id)
                sched.abort(live.req.request_id)
                self._end_now(live, FinishReason.ABORT)
        elif level >= 1:  # keep: their KV is discarded, so they are recomputed after waking
            for req in list(sched.running):
                sched.preempt(req.request_id)
        if level >= 1:  # the KV cache is freed: held prefills and the prefix cache go
            if self.connector is not None:
                self.connector.release_all()
            sched.cache.evict(sched.cache.evictable_blocks)
            self._reset_tier(reset_connector)  # (vLLM's connector reset)
        self.sleep.sleep(level)
        self.stats.pd_sleep(self.core, self.sleep, self.connector)
        log.info("%s asleep at level %d (mode %s)", self.name, level, mode)
        return m.Admission(seq)
