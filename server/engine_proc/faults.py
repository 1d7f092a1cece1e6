"""Device faults in the engine-core process: what a slowdown, a hang, a crash and lost chips
do to the real-time loop, and the metrics that show them.

Why it exists: the loop (`loop.py`) stays the loop; this driver is the one place that
turns the deployment's fault schedule (`server.engine.faults`) into effects, at step
boundaries on the emulated timeline:
- slowdown: a step that starts inside the window costs `factor` × its device time (the
  step-time histogram and the clients' inter-token latency grow by the factor);
- hang: a step due inside the window starts only at its end — no token for anyone, the
  process alive and answering (health stays SERVING, admissions are answered and queue), as a
  wedged GPU; the stall is counted live in `doppelchip_hang_seconds_total`;
- crash: the engine process exits (`os._exit`), for real: the supervisor ends its requests
  (UNAVAILABLE / HTTP 500) and restarts it after the back-off plus the cold start; with vLLM's
  fault tolerance (a `Sentinel`) the busy loop's error is caught instead: every request is
  aborted and the engine waits for a recovery instruction, exiting as above only when none
  came within its timeout (server/engine_proc/sentinel.py);
- lost chips: the pool loses `chips / chip_count` of its KV blocks (each chip holds that
  share of every layer's KV: TP shards heads, PP layers), held here like retired memory until
  the chips come back; running requests are preempted (recompute) to make the room, so
  `vllm:num_preemptions_total` grows. Step cost is unchanged (the survivors' compute is not
  modelled as lost; only the memory).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Iterable

from server.engine.core import EngineCore, StepResult
from server.engine.faults import Schedule, Window, parse_specs
from server.engine.options import EngineOptions
from server.engine_proc.sentinel import FAULT_INFO, Sentinel
from server.engine_proc.stats import EngineStats

log = logging.getLogger("doppelchip.engine")

HANG_SLICE_WALL_S = 0.05  # the hang counter moves at least this often (wall seconds)
CRASH_EXIT_STATUS = 70  # what an injected crash exits with (EX_SOFTWARE)


def schedule_of(opts: EngineOptions) -> Schedule:
    seed = opts.seed if opts.failure_injection_seed is None else opts.failure_injection_seed
    return Schedule({
        "slowdown": parse_specs("slowdown", opts.fault_slowdown),
        "hang": parse_specs("hang", opts.fault_hang),
        "crash": parse_specs("crash", opts.fault_crash),
        "lost_chips": parse_specs("lost_chips", opts.fault_lost_chips),
    }, seed)


class FaultDriver:
    def __init__(self, schedule: Schedule, core: EngineCore, stats: EngineStats,
                 time_scale: float, name: str, sentinel: Sentinel | None = None) -> None:
        self.schedule, self.core, self.stats = schedule, core, stats
        self.scale, self.name = time_scale, name
        self.sentinel = sentinel  # vLLM's fault tolerance, or None (a crash exits)
        self.abort_all: Callable[[], None] = lambda: None  # the loop's: end every request
        self.active: list[Window] = []  # slowdown, hang and lost_chips occurrences running
        self.held: list[int] = []  # KV blocks lost with the chips
        self.preempted: list[str] = []  # requests preempted to make room (published next step)
        self._chips = max(1, core.placement.chips)

    @property
    def holds_blocks(self) -> bool:
        return bool(self.held)

    # ---- the timeline -----------------------------------------------------------------------
    def start(self, t: float) -> None:
        """The engine is ready at `t`: occurrences before it are skipped (a restart does not
        replay the crash that caused it); windows still open at `t` take effect now."""
        for w in self.schedule.arm(t):
            self._open(w, t)
        self._gauges()
        if (nxt := self.schedule.next_start()) is not None or self.active:
            log.info("fault injection: %s armed at t=%.3f s (emulated); next fault at %s",
                     self.name, t, "none" if nxt is None else f"t={nxt:.3f} s")

    def advance(self, t: float) -> None:
        """Open what is due at `t`, close what ended; a due crash ends the process here (with
        fault tolerance: the engine faults, and ends here once its recovery timed out)."""
        ft = self.sentinel
        if ft is not None and ft.expired(t):  # vLLM re-raises the busy loop's error
            log.error("[FT] No recovery within %ds timeout.", ft.timeout_s)
            logging.shutdown()
            os._exit(CRASH_EXIT_STATUS)
        opened: list[str] = []
        for w in self.schedule.due(t):
            if w.kind == "crash":
                self._count(w.kind)
                if ft is not None:
                    log.warning("fault injection: %s crashes at t=%.3f s (emulated). [FT] "
                                "Busy loop raised %s. Waiting for recovery.", self.name,
                                w.start, FAULT_INFO)
                    self.abort_all()
                    ft.on_fault(t)
                    ft.publish(self.stats)
                    continue
                log.error("fault injection: %s crashes (engine process exits) at t=%.3f s "
                          "(emulated)", self.name, w.start)
                logging.shutdown()
                os._exit(CRASH_EXIT_STATUS)
            self._open(w, t)
            opened.append(w.kind)
        ended = [w for w in self.active if w.end <= t]
        if ended:
            self.active = [w for w in self.active if w.end > t]
            for w in ended:
                log.info("fault injection: %s %s ended at t=%.3f s", self.name, w.kind, w.end)
        if opened or ended:
            self._rebalance()
            self._gauges(opened)  # counts with gauges: no scrape sees one without the other

    def _open(self, w: Window, t: float) -> None:
        log.warning("fault injection: %s %s from t=%.3f s to %s (emulated)", self.name, w.kind,
                    w.start, "the next restart" if math.isinf(w.end) else f"{w.end:.3f} s")
        if w.end > t:
            self.active.append(w)

    def next_event(self) -> float | None:
        """Emulated time of the next opening or closing (an idle engine wakes for it)."""
        times = [w.end for w in self.active if not math.isinf(w.end)]
        if (s := self.schedule.next_start()) is not None:
            times.append(s)
        if self.sentinel is not None and self.sentinel.deadline is not None:
            times.append(self.sentinel.deadline)
        return min(times) if times else None

    # ---- effects ----------------------------------------------------------------------------
    def factor(self, t: float) -> float:
        return max((w.spec.factor for w in self.active
                    if w.kind == "slowdown" and w.start <= t < w.end), default=1.0)

    def slow(self, result: StepResult, start: float) -> StepResult:
        """The step's device time × the slowdown factor in force at its start."""
        f = self.factor(start)
        if f == 1.0:
            return result
        busy = result.seconds - result.stall_s
        return dataclasses.replace(result, seconds=result.stall_s + busy * f)

    def hang(self, start: float, wait_until: Callable[[float], None]) -> float:
        """A step due at `start` inside a hang waits for its end (answering messages
        meanwhile); the emulated time it may start at."""
        hangs = [w for w in self.active if w.kind == "hang" and w.start <= start < w.end]
        if not hangs:
            return start
        end = max(w.end for w in hangs)
        log.warning("fault injection: %s hangs: no step until t=%.3f s (%d running)",
                    self.name, end, self.core.scheduler.num_running)
        self._set("doppelchip_fault_active", 1.0, "hang")
        t, step = start, HANG_SLICE_WALL_S / self.scale
        while t < end:
            nxt = min(end, t + step)
            wait_until(nxt)
            self._add("doppelchip_hang_seconds", nxt - t)
            t = nxt
        self._set("doppelchip_fault_active", 0.0, "hang")
        return end

    def _rebalance(self) -> None:
        """Hold exactly the blocks the lost chips took: give back what came back, take what
        is lost (free blocks, then evictable cache blocks, then running requests' blocks by
        preempting the policy's victims)."""
        sched = self.core.scheduler
        pool, cache = sched.pool, sched.cache
        chips = sum(w.spec.chips for w in self.active if w.kind == "lost_chips")
        chips = min(chips, self._chips - 1)
        target = min(pool.num_blocks - 1, pool.num_blocks * chips // self._chips)
        if len(self.held) > target:
            pool.free(self.held[target:])
            del self.held[target:]
        while len(self.held) < target:
            need = target - len(self.held)
            if pool.num_free < need and cache.evictable_blocks:
                cache.evict(need - pool.num_free)
            take = min(need, pool.num_free)
            if take:
                self.held.extend(pool.allocate(take))
                continue
            if not sched.running:
                break  # nothing more to take (cannot happen: waiting requests hold no KV)
            victim = sched.waiting.choose_victim(sched.running)
            sched.preempt(victim.request_id)
            self.preempted.append(victim.request_id)
        self._set("doppelchip_kv_lost_blocks", float(len(self.held)))

    def take_preempted(self) -> list[str]:
        out, self.preempted = self.preempted, []
        return out

    # ---- metrics ----------------------------------------------------------------------------
    def _gauges(self, opened: Iterable[str] = ()) -> None:
        """The gauges, and the events of the faults that just `opened`, in one update."""
        f = self.stats
        f.file.begin()
        for kind in opened:
            f.a[f.slot("doppelchip_fault_events", kind)] += 1.0
        for kind in ("slowdown", "lost_chips"):
            on = any(w.kind == kind for w in self.active)
            f.a[f.slot("doppelchip_fault_active", kind)] = float(on)
        factor = max((w.spec.factor for w in self.active if w.kind == "slowdown"), default=1.0)
        f.a[f.slot("doppelchip_slowdown_factor")] = factor
        f.file.end()

    def _count(self, kind: str) -> None:
        self._add("doppelchip_fault_events", 1.0, kind)

    def _add(self, name: str, value: float, label: str | None = None) -> None:
        f = self.stats
        f.file.begin()
        f.a[f.slot(name, label)] += value
        f.file.end()

    def _set(self, name: str, value: float, label: str | None = None) -> None:
        f = self.stats
        f.file.begin()
        f.a[f.slot(name, label)] = value
        f.file.end()
