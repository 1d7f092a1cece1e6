"""The engine core's real-time loop, fed over ZeroMQ: the single writer of one deployment's
scheduler and KV state.

One turn:
1. move accepted requests into the scheduler and apply aborts (`_take_inbox`);
2. idle: block on the input socket (no busy polling) and resume the timeline at the wall
   clock when woken, the gap charged as idle power;
3. `core.step(start)`; the step ends at the absolute deadline `start + seconds`, where `start` is
   the previous deadline (so Python overhead never accumulates into the emulated timeline)
   but never before an admitted request arrived;
4. wait for the deadline while answering admissions and taking aborts (`_wait_until`);
   aborts that came meanwhile win over the step's tokens;
5. publish one `StepOutputs` per front end with the new tokens, then write the stats array.

What arrives is handled in `loop_inputs.py`, what leaves in `loop_outputs.py`, the work
outside the steps (KV events, sleep, P/D timers) in `loop_controls.py`: mixins of `EngineLoop`.

Flow control: when the engine is behind its timeline (the host cannot keep up), each step
asks its front ends for an `Ack`, and the engine does not run more than `MAX_UNACKED` steps
ahead of a front end that has not absorbed them: a lagging engine then spends its CPU in step
with what the front ends can deliver instead of flooding them.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import zmq

from server.engine.clock import Timeline
from server.engine.core import EngineCore
from server.engine.intake import Limits
from server.engine.interface import FinishReason
from server.engine.kv_events_config import KVEventsConfig
from server.engine.kv_transfer import KvTransferConfig
from server.engine_proc.checkpoint import CheckpointState
from server.engine_proc.faults import FaultDriver
from server.engine_proc.kv_connector import NixlConnector
from server.engine_proc.loop_controls import Live, LoopControls
from server.engine_proc.loop_inputs import LoopInputs
from server.engine_proc.loop_outputs import LoopOutputs
from server.engine_proc.lora import LoraPublisher, lora_file
from server.engine_proc.pause import PauseState
from server.engine_proc.profiler import StepProfiler
from server.engine_proc.sentinel import Sentinel
from server.engine_proc.sleep import SleepState
from server.engine_proc.stats import EngineStats
from server.ipc import messages as m
from server.ipc.deployment import DeploymentInfo
from server.ipc.paths import RunDir
from server.kv_events.publisher import KvEventPublisher

log = logging.getLogger("doppelchip.engine")

MAX_UNACKED = 2  # steps a lagging engine may run ahead of what a front end delivered
WARN_LAG_WALL_S = 0.02  # warn when a step ends this much wall time behind its deadline
WARN_EVERY_S = 10.0


class EngineLoop(LoopInputs, LoopControls, LoopOutputs):
    def __init__(self, *, deployment: int, rank: int, epoch: int, core: EngineCore,
                 limits: Limits, stats: EngineStats, run_dir: RunDir, num_frontends: int,
                 timeline: Timeline, cold: bool, check_integrity: bool,
                 kv_events: KVEventsConfig | None = None, kv_offset: int = 0,
                 kv_exposed: bool = False, kv_pinned: tuple[str, str] = ("", ""),
                 kv_wire: str = "vllm",
                 kv_transfer: KvTransferConfig | None = None,
                 info: DeploymentInfo | None = None,
                 faults: FaultDriver | None = None,
                 profiler: StepProfiler | None = None,
                 prepare_on_startup: bool = False, sentinel: Sentinel | None = None) -> None:
        self.deployment, self.rank, self.epoch = deployment, rank, epoch
        self.core, self.limits, self.stats = core, limits, stats
        self.name = limits.name
        self.timeline, self.now = timeline, timeline.now
        self.scale, self.cold = timeline.time_scale, cold
        self.check_integrity = check_integrity
        self.ctx = zmq.Context()
        self.input = self.ctx.socket(zmq.PULL)
        self.input.setsockopt(zmq.LINGER, 0)
        self.input.setsockopt(zmq.RCVHWM, 0)  # a burst queues here; max_waiting refuses it
        self.input.bind(run_dir.engine_input(deployment, rank))
        self.outputs = []
        for i in range(num_frontends):
            s = self.ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RECONNECT_IVL, 10)
            s.connect(run_dir.frontend_input(i))
            self.outputs.append(s)
        self.pending: list[deque[bytes]] = [deque() for _ in range(num_frontends)]
        self.poller = zmq.Poller()
        self.poller.register(self.input, zmq.POLLIN)
        self.unacked: list[deque[int]] = [deque() for _ in range(num_frontends)]
        self.step_no = 0
        self.live: dict[str, Live] = {}  # by the scheduler's key "frontend:seq"
        self.by_rid: set[str] = set()
        self.inbox: list[Live] = []
        self.aborts: dict[str, FinishReason] = {}
        self.state = "compiling"
        self.stopping = False
        self._t = 0.0  # emulated end of the last step
        self._latest_arrival = 0.0
        self._lagging = False
        self._warned = -WARN_EVERY_S
        # --- KV events (issue 13): the cache's log, published once per step from here ---
        self.kv_log = getattr(core.scheduler.cache, "events", None)
        self.kv_pub: KvEventPublisher | None = None
        if kv_events is not None and kv_events.enabled and self.kv_log is not None:
            dp_rank = info.dp_rank if info is not None else rank  # vLLM's: ports by it
            self.kv_pub = KvEventPublisher(self.ctx, kv_events, rank=dp_rank,
                                           offset=kv_offset + dp_rank, exposed=kv_exposed,
                                           pinned=kv_pinned, wire=kv_wire)
            if self.kv_pub.replay is not None:
                self.poller.register(self.kv_pub.replay, zmq.POLLIN)
        # --- LoRA (issue 13) ---
        self.lora = (LoraPublisher(core, lora_file(run_dir.engine_stats(deployment, rank)))
                     if core.lora is not None else None)
        # --- P/D and sleep mode (issue 13) ---
        nixl = kv_transfer.nixl if kv_transfer is not None else None
        self.connector = (NixlConnector(nixl, info, rank, core.scheduler, self.ctx,
                                        self.poller, lambda: max(self._t, self.now()))
                          if nixl is not None and info is not None else None)
        self.sleep = SleepState()
        self.pending_sleep: tuple[int, int, int, bool] | None = None  # (frontend, seq, level,
        #                                                                   reset_connector)
        self.timers: list[tuple[float, int, int]] = []  # (emulated t, frontend, seq) replies
        self.pause = PauseState()  # vLLM's /pause (server/engine_proc/pause.py)
        self.faults = faults  # device faults (issue 13): server/engine_proc/faults.py
        self.sentinel = sentinel  # vLLM's fault tolerance (sentinel.py), or None
        if faults is not None:
            faults.abort_all = self._abort_all
        self.kv_metrics = core.scheduler.pool.metrics  # vLLM's --kv-cache-metrics (or None)
        self.profiler = profiler  # vLLM's /start_profile (--profiler-config), or None
        self.weight_version = "default"  # vLLM's label of the weights (RL), on every output
        self.prepare_on_startup = prepare_on_startup  # vLLM 0.34.0's (checkpoint.py)

    # ---- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        core = self.core
        self._t = self.now()
        startup = core.compiler.startup_seconds(self.cold)
        if startup > 0:
            self.stats.set_state("compiling", f"building its engine: {startup:.1f} s (emulated)")
            self._wait_until(self._t + startup)
            self._t += startup
            self.stats.startup(startup)
        if self.stopping:
            return
        self.state = "ready"
        self.stats.set_state("ready", "ready", self._t)
        if self.faults is not None:
            self.faults.start(self._t)
        if self.prepare_on_startup:  # --checkpoint-prepare-on-startup: idle, so PREPARED now
            self._prepare("wait")
        self._resync()
        while not self.stopping:
            self._tick()
            if self.pause.commands:
                self._apply_pause_commands()
            self._take_inbox()
            if not core.has_unfinished():
                self._publish_kv_events()  # what aborts and finishes stored or evicted
            if self.pending_sleep is not None and not core.has_unfinished():
                fe, seq, level, reset = self.pending_sleep  # mode "wait": the last one ended
                self.pending_sleep = None
                self._send(fe, m.encode(m.Admissions(self.deployment, self.rank, [
                    self._fall_asleep(level, "wait", seq, reset)])))
            if ((self.pause.waiters or self.checkpoint == CheckpointState.PREPARING)
                    and not core.scheduler.running):
                self._pause_holds()  # mode wait: the last running one finished
            if not core.has_unfinished() or self.sleep.sleeping or self.pause.frozen:
                if self.faults is not None:
                    self.faults.advance(self.now())
                if (self.check_integrity and not core.has_unfinished()
                        and not (self.faults and self.faults.holds_blocks)):
                    core.scheduler.check_integrity()  # every request released: pool and cache
                self.stats.idle(core, self.num_queued(), self.kv_fetch(), self._t)
                self.stats.pd_sleep(core, self.sleep, self.connector)
                self._lagging = False
                self._idle()
                continue
            if self._lagging and any(len(q) > MAX_UNACKED for q in self.unacked):
                self._service(None)  # wait for the front ends to absorb what was sent
                continue
            start = max(self._t, self._latest_arrival)
            if self.faults is not None:  # a crash exits here; a hang holds the step back
                self.faults.advance(start)
                start = self.faults.hang(start, self._wait_until)
            if self.kv_metrics is not None:  # --kv-cache-metrics: the step allocates at start
                self.kv_metrics.now = start
            result = core.step(start)
            if result is None:  # everything waiting is blocked: wait for an abort, an
                # arrival or a KV load's end (the gauges show the loads it started)
                self.stats.idle(core, self.num_queued(), self.kv_fetch(), self._t)
                if core.next_deadline() is not None:
                    self._idle()
                else:
                    self._service(self._idle_timeout_ms())
                    self._resync()
                continue
            if self.faults is not None:
                result = self.faults.slow(result, start)
            self._t = start + result.seconds
            self._wait_until(self._t)
            lag = max(0.0, self.now() - self._t)
            self._note_lag(lag)
            self._take_inbox()  # aborts that arrived during the step win over its tokens
            # status first: a client that sees the step's tokens sees its load and KV too
            self.stats.step(core, result, lag, self._t, self.num_queued(), self.kv_fetch())
            if self.profiler is not None and self.profiler.active:  # /start_profile
                self.profiler.step(start, result, core)
            self._publish_kv_events()
            if self.lora is not None:  # --- LoRA (issue 13) ---
                self.lora.step([live.req for live in self.inbox])
            self.stats.pd_sleep(core, self.sleep, self.connector)
            self._publish(result, start)
        self._shutdown()

    def num_queued(self) -> int:
        """Accepted and not yet running (the admission-control count), P/D requests whose KV
        is still on its way included (vLLM's waiting queue holds them)."""
        n = len(self.inbox) + self.core.scheduler.num_waiting
        return n + len(self.connector.pending) if self.connector is not None else n

    def kv_fetch(self) -> tuple[int, int, int]:
        """vLLM's async KV loads by stage (waiting_to_start, in_progress, completed_waiting):
        the scheduler's (the CPU tier's loads, the NIXL pulls), and the reads the prefill pod
        has not answered yet (their pulls have not started)."""
        start, going, done = self.core.scheduler.kv_fetch_stages()
        if self.connector is not None:
            start += len(self.connector.pending)
        return start, going, done

    def _resync(self) -> None:
        """After idling, the timeline resumes at the earliest arrival that woke it (the device
        could have started then: the IPC hop costs the client nothing on the emulated
        timeline, and shows as lag if the host is late), else at the wall clock; the gap is
        charged as idle. An idle engine woken by anything else (a front end's ack, a status
        message) does not resync: a request stamped before that wake-up may still be on its
        way, and resuming at the wall clock would charge it the host's delay as queue time."""
        self._idle_until(min((live.req.arrival_time for live in self.inbox),
                             default=self.now()))

    def _idle_until(self, t: float) -> None:
        """Move the idle timeline forward to `t` (never back), charging the gap as idle."""
        if t > self._t:
            self.core.account_idle(t - self._t)
            self._t = t

    def _idle_timeout_ms(self) -> int | None:
        """How long an idle engine may block: until its next fault event, else forever."""
        t = self.faults.next_event() if self.faults is not None else None
        if t is None:
            return None
        return max(0, min(60_000, int(self.timeline.wall_until(t) * 1000) + 1))  # poll's int

    def _note_lag(self, lag: float) -> None:
        wall = lag * self.scale
        self._lagging = wall > 0.001
        if wall > WARN_LAG_WALL_S and time.monotonic() - self._warned > WARN_EVERY_S:
            self._warned = time.monotonic()
            log.warning("deployment %s is %.1f ms (wall) behind its emulated timeline: the "
                        "host cannot keep up (%d running)", self.name, wall * 1e3,
                        self.core.scheduler.num_running)

    def _wait_until(self, t: float) -> None:
        """Sleep until emulated time `t`, answering messages meanwhile (sub-millisecond
        remainders by time.sleep: zmq's poll timeout is whole milliseconds)."""
        wall_until = self.timeline.wall_until
        while not self.stopping:
            wall = wall_until(t)
            if wall <= 0:
                return
            if wall >= 0.001:
                self._service(int(wall * 1000))
            else:
                self._service(0)
                wall = wall_until(t)
                if wall > 0:
                    time.sleep(wall)

    def _shutdown(self) -> None:
        if not self.core.has_unfinished():
            self._idle_until(self.now())  # idle up to the stop (no arrival resynced it)
        for live in list(self.live.values()):
            self.core.scheduler.abort(live.req.request_id)
            self._forget(live, FinishReason.ABORT)
        s = self.core.stats  # the core's own accounting, for whoever audits the metrics
        log.info("engine core of %s (rank %d) stopped: steps=%d busy_s=%r stall_s=%r bytes=%r "
                 "flops=%r joules=%r dollars=%r", self.name, self.rank, s.steps, s.busy_s,
                 s.stall_s, s.bytes, s.flops, s.joules, s.dollars)
        self.stats.set_state("draining", "shut down")
        if self.kv_pub is not None:
            self.kv_pub.close()
        if self.connector is not None:
            self.connector.close()
        for sock in (self.input, *self.outputs):
            sock.close(linger=0)
        self.ctx.term()
