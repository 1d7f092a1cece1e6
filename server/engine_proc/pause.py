"""Pausing generation (vLLM's `POST /pause`, `POST /resume`, `GET /is_paused`) on the engine
core: what happens to the requests in flight, to new ones, and to the prefix cache.

Why it exists: RL trainers pause their vLLM engines between rollouts to load new weights, then
resume them; a doppelchip pod must hold, refuse and resume requests as such an engine does so
that the trainer's orchestration can be tested without GPUs. vLLM 0.33.0's semantics, followed
from vllm/v1/engine/core.py (`EngineCoreProc.pause_generation`, `pause_scheduler`,
`_reject_add_while_paused`) and vllm/v1/core/sched/scheduler.py (`PauseState`):

- mode "abort" (default): every request in flight or queued is aborted at once;
- mode "wait": running requests go on to their end while queued ones stay queued (vLLM's
  PAUSED_NEW: the scheduler admits none); the pause answers once the running ones are done;
- mode "keep": nothing is scheduled (PAUSED_ALL); every request stays where it is and goes on
  after the resume.
- In modes abort and wait a new request is refused with a retryable error until the resume
  (`PAUSED_MESSAGE`; HTTP 503); in mode keep it is accepted and queued.
- `clear_cache` (default true, ignored in mode keep): the prefix cache is emptied once the
  pause holds (vLLM's `_reset_caches`; refused, as vLLM's reset, while a request holds blocks).
- A wake-up that leaves nothing asleep resumes a paused engine, as vLLM 0.33.0's `wake_up`
  calls `resume_scheduler`; `/resume` lifts the pause only (a sleeping engine stays asleep).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from server.ipc import messages as m

MODES = ("abort", "wait", "keep")
PAUSED_MESSAGE = "Generation is paused. Please retry after it resumes."


@dataclass
class PauseState:
    """The engine loop's pause (one writer: the loop). Commands are applied between steps, as
    vLLM's engine core runs them between its steps: a command that arrives during a step
    waits in `commands` until that step's tokens have been sent."""

    mode: str | None = None  # None: generating
    commands: list[m.Pause | m.Resume | m.Checkpoint] = field(default_factory=list)  # to apply
    waiters: list[tuple[int, int]] = field(default_factory=list)  # wait: (frontend, seq)
    clear_cache: bool = False  # a waiter asked for the cache to be emptied

    @property
    def paused(self) -> bool:
        return self.mode is not None

    @property
    def rejects_new(self) -> bool:
        """Modes abort and wait refuse new requests, from the pause's arrival (a request
        behind it in the same step is refused too) until the resume."""
        mode = self.mode
        for command in self.commands:  # (a checkpoint's prepare pauses in its mode)
            if isinstance(command, m.Checkpoint):
                mode = command.mode if command.action == "prepare" else mode
                continue
            mode = command.mode if isinstance(command, m.Pause) else None
        return mode in ("abort", "wait")

    @property
    def frozen(self) -> bool:
        """Mode keep: the engine takes no step until the resume."""
        return self.mode == "keep"
