"""vLLM 0.34.0's process-checkpoint lifecycle on the engine core (`vllm/v1/engine/core.py`:
`checkpoint_prepare`, `checkpoint_restore`, `_finish_pause`), as a mixin of `EngineLoop`
(server/engine_proc/loop.py), which owns every attribute used here.

Why: an orchestrator that scales vLLM pods from zero by checkpointing a warm process (CRIU
and the like) asks the engine to prepare, polls `/checkpoint/status` until it may capture,
then restores. A doppelchip pod goes through the same states, so that orchestrator can be
tested without GPUs (the HTTP routes are server/http/checkpoint.py).

1. RUNNING → prepare(mode): refused with nothing changed while the engine sleeps; else
   PREPARING and a pause in `mode` (abort, wait, keep; pause.py), new requests refused in
   modes abort and wait until the resume. Preparing again, or while prepared, changes nothing.
2. Once the pause holds (mode wait: the running requests finished), the KV cache is released
   as `release_kv_cache_memory` releases it: requests frozen by mode keep are preempted (they
   recompute after the restore), those queued stay queued, the prefix cache and the CPU tier
   are emptied, the KV memory discarded: PREPARED. Had the release been refused, the state
   would be FAILED with its error, as vLLM's (its release fails on device errors, which are
   not emulated: here it does not fail).
3. PREPARED → restore: RESTORING, the KV cache woken up; nothing else asleep, the scheduler
   resumes: RUNNING. `/resume` and `/wake_up` are refused until then, `/sleep` while not
   RUNNING (vLLM's RuntimeErrors).
"""

from __future__ import annotations

import enum
import logging

from server.engine_proc import pause
from server.ipc import messages as m

log = logging.getLogger("doppelchip.engine")


class CheckpointState(enum.StrEnum):
    """vLLM's `CheckpointState`: the engine serves only while RUNNING."""

    RUNNING = "running"
    PREPARING = "preparing"  # draining, then releasing what a checkpoint must not hold
    PREPARED = "prepared"  # safe to capture
    RESTORING = "restoring"  # bringing back what preparing released
    FAILED = "failed"

    @property
    def is_restored(self) -> bool:
        """Released state is back or coming back: memory may wake, scheduling resume."""
        return self in (CheckpointState.RUNNING, CheckpointState.RESTORING)


def combined(states: list[tuple[CheckpointState, str | None]]
             ) -> tuple[CheckpointState, str | None]:
    """The state of a deployment's ranks together, as vLLM's DP client reports it: failed if
    one failed (its error), else the state they share, else the transition under way."""
    seen: dict[CheckpointState, str | None] = {}
    for state, error in states:
        seen.setdefault(state, error)
    if CheckpointState.FAILED in seen:
        return CheckpointState.FAILED, seen[CheckpointState.FAILED]
    if len(seen) == 1:
        return next(iter(seen)), None
    if CheckpointState.PREPARING in seen:
        return CheckpointState.PREPARING, None
    return CheckpointState.RESTORING, None


def encode(state: CheckpointState, error: str | None) -> str:
    return f"{state}:{error}" if error else str(state)


def decode(message: str) -> tuple[CheckpointState, str | None]:
    state, _, error = message.partition(":")
    return CheckpointState(state), error or None


class LoopCheckpoint:
    """EngineLoop's checkpoint methods (see the module docstring)."""

    checkpoint: CheckpointState = CheckpointState.RUNNING
    checkpoint_error: str | None = None

    def _checkpoint(self, msg: m.Checkpoint) -> m.Admission:
        """Prepare, restore or report; answered at once with the state then (vLLM's routes
        return once a prepare has started: the drain is polled through the state)."""
        if msg.action == "prepare":
            refusal = self._prepare(msg.mode)
            if refusal is not None:
                return m.Admission(msg.seq, "InvalidRequest", refusal)
        elif msg.action == "restore" and not self.checkpoint.is_restored:
            if self.checkpoint != CheckpointState.PREPARED:
                return m.Admission(msg.seq, "CheckpointBlocked", "Call to checkpoint_restore "
                                   "method failed: Cannot restore while the checkpoint state "
                                   f"is {self.checkpoint}")
            self._restore()
        return m.Admission(msg.seq, message=encode(self.checkpoint, self.checkpoint_error))

    def _prepare(self, mode: str) -> str | None:
        """Start preparing (None), or why not with nothing changed (vLLM's refusals)."""
        state = self.checkpoint
        if state in (CheckpointState.PREPARING, CheckpointState.PREPARED):
            return None
        if state != CheckpointState.RUNNING:
            return f"Cannot prepare while the checkpoint state is {state}"
        if self.sleep.sleeping:
            return "Preparing for a checkpoint requires an awake engine"
        if mode not in pause.MODES:
            return f"Invalid pause mode: {mode}"
        self.checkpoint = CheckpointState.PREPARING
        log.info("%s preparing for a process checkpoint (mode %s)", self.name, mode)
        if self._begin_pause(mode):  # else (mode wait) once the running ones finished
            self._finish_prepare()
        return None

    def _finish_prepare(self) -> None:
        """The drain is complete: release the KV cache (PREPARED) or fail as vLLM's."""
        released = self._release_kv_cache(-1, reset_connector=True)
        if released.error:
            self.checkpoint, self.checkpoint_error = CheckpointState.FAILED, released.message
            log.error("%s: process checkpoint lifecycle failed: %s", self.name, released.message)
            return
        self.checkpoint = CheckpointState.PREPARED
        log.info("%s prepared for a process checkpoint", self.name)

    def _restore(self) -> None:
        """Bring the KV cache back; with nothing else asleep the scheduler resumes (RUNNING:
        `_resume`)."""
        log.info("%s restoring from a process checkpoint", self.name)
        self.checkpoint = CheckpointState.RESTORING
        self.sleep.wake(("kv_cache",), self.core.placement)
        if not self.sleep.sleeping:
            self._resume()
        self.stats.pd_sleep(self.core, self.sleep, self.connector)

    def _checkpoint_blocks(self, seq: int, method: str) -> m.Admission | None:
        """vLLM's guards on its engine's `sleep` (only while RUNNING), `wake_up` and
        `resume_scheduler` (only once restored): the refusal, or None."""
        state, doing = self.checkpoint, {"sleep": "sleep", "wake_up": "wake up",
                                         "resume_scheduler": "resume scheduling"}[method]
        allowed = state == CheckpointState.RUNNING if method == "sleep" else state.is_restored
        if allowed:
            return None
        return m.Admission(seq, "CheckpointBlocked", f"Call to {method} method failed: "
                           f"Cannot {doing} while the checkpoint state is {state}")
