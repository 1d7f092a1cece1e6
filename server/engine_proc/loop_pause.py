"""Pausing generation (vLLM's `/pause` and `/resume`; the state is `pause.py`'s), as a mixin
of `EngineLoop` (server/engine_proc/loop.py), which owns every attribute used here: a pause in
mode abort, wait or keep, the waiters of mode wait answered once the running requests
finished, the resume, and the cache clearing a pause or a KV release does (vLLM's
`_reset_caches`: the device's prefix cache, and with `reset_connector` the CPU tier's).

Why a mixin of its own: the same single writer's state changes as `loop_controls.py`'s, split
off so each file reads on its own; a checkpoint's prepare (`checkpoint.py`) pauses through
`_begin_pause` and finishes in `_pause_holds`.
"""

from __future__ import annotations

import logging

from server.engine.interface import FinishReason
from server.engine_proc import pause
from server.engine_proc.checkpoint import CheckpointState
from server.ipc import messages as m

log = logging.getLogger("doppelchip.engine")


class LoopPause:
    """EngineLoop's pause methods (see the module docstring)."""

    def _apply_pause_commands(self) -> None:
        """The pause commands that arrived since the last step, in order, each answered now
        or (mode wait) once the running requests finished."""
        commands, self.pause.commands = self.pause.commands, []
        for msg in commands:
            answer = (self._checkpoint(msg) if isinstance(msg, m.Checkpoint)
                      else self._pause(msg))
            if answer is not None:
                self._send(msg.frontend, m.encode(m.Admissions(self.deployment, self.rank,
                                                               [answer])))

    def _pause(self, msg: m.Pause | m.Resume) -> m.Admission | None:
        """Pause (mode abort, wait or keep) or resume; the answer now, or None when it comes
        once the running requests finished (mode wait)."""
        state = self.pause
        if isinstance(msg, m.Resume):
            if (blocked := self._checkpoint_blocks(msg.seq, "resume_scheduler")) is not None:
                return blocked
            self._resume()
            return m.Admission(msg.seq)
        if msg.mode not in pause.MODES:
            return m.Admission(msg.seq, "InvalidRequest", f"Invalid pause mode: {msg.mode}")
        if not self._begin_pause(msg.mode):
            state.waiters.append((msg.frontend, msg.seq))
            state.clear_cache |= msg.clear_cache
            return None
        if msg.clear_cache and msg.mode != "keep":
            self._clear_cache()
        return m.Admission(msg.seq)

    def _begin_pause(self, mode: str) -> bool:
        """Pause in `mode`; whether it holds now (else, mode wait: once the running requests
        finished, `_pause_holds`)."""
        sched, state = self.core.scheduler, self.pause
        if mode == "abort":  # everything in flight or queued ends now
            self._abort_all()
        state.mode, sched.paused_new = mode, mode != "keep"
        self.stats.paused(True)
        log.info("%s paused generation (mode %s)", self.name, mode)
        return not (mode == "wait" and sched.running)

    def _abort_all(self) -> None:
        """End every request in flight or queued now, aborted (a pause in mode abort; a
        fault under fault tolerance, as vLLM's sentinel aborts them)."""
        for live in list(self.live.values()):
            if live in self.inbox:
                self.inbox.remove(live)
            if self.connector is not None:
                self.connector.abort(live.req.request_id)
            self.core.scheduler.abort(live.req.request_id)
            self._end_now(live, FinishReason.ABORT)

    def _resume(self) -> None:
        """Lift the pause (`/resume`, or a wake-up that left nothing asleep)."""
        sched, state = self.core.scheduler, self.pause
        self._pause_holds()  # a pause still waiting ends with the resume
        if state.frozen or not sched.running:  # the paused time was idle on the timeline
            self._idle_until(self.now())
        state.mode, sched.paused_new = None, False
        if self.checkpoint == CheckpointState.RESTORING:  # vLLM's resume_scheduler
            self.checkpoint = CheckpointState.RUNNING
        self.stats.paused(False)
        log.info("%s resumed generation", self.name)

    def _pause_holds(self) -> None:
        """Answer the pauses that waited for the running requests (mode wait), and finish a
        checkpoint's prepare that waited for them."""
        state = self.pause
        if state.waiters:
            if state.clear_cache:
                self._clear_cache()
            for fe, seq in state.waiters:
                self._send(fe, m.encode(m.Admissions(self.deployment, self.rank,
                                                     [m.Admission(seq)])))
            state.waiters, state.clear_cache = [], False
        if self.checkpoint == CheckpointState.PREPARING:
            self._finish_prepare()

    def _clear_cache(self, reset_connector: bool = True) -> None:
        """A pause's or a release's cache clearing (vLLM's `_reset_caches`): the device's
        prefix cache, and with `reset_connector` the CPU tier's."""
        sched = self.core.scheduler
        reset = getattr(sched.cache, "reset", None)
        if reset is not None and not reset():
            log.info("prefix cache not reset on %s: requests hold blocks", self.name)
        self._reset_tier(reset_connector)
        self._publish_kv_events()

    def _reset_tier(self, reset_connector: bool) -> None:
        offload = self.core.scheduler.offload
        if reset_connector and offload is not None and not offload.reset():
            log.warning("CPU KV tier not reset on %s: a load is in flight", self.name)
