"""The control commands a front end sends a deployment's engines and awaits: resetting the
prefix cache, sleep mode, pausing generation (`DeploymentControls`, a mixin of
`DeploymentClient`, which owns the sockets and the pending answers).

Why apart: these are the control plane (a few calls per minute at most), the client's own
module is the request path; the engine loop splits the same way (`loop_controls.py`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import zmq

from server.engine.errors import (
    AlreadyExists,
    CheckpointBlocked,
    EngineError,
    EngineFaulted,
    InvalidRequest,
    MaxQueuedTokens,
    NotPlaced,
    Overloaded,
    Paused,
    QueueOverflow,
    Unavailable,
)
from server.ipc import messages as m

# an engine's refusal by its error's name (an `Admission.error`) -> the typed error
ERRORS: dict[str, type[EngineError]] = {
    c.__name__: c for c in (InvalidRequest, AlreadyExists, Overloaded, Unavailable, NotPlaced,
                            Paused, QueueOverflow, MaxQueuedTokens, CheckpointBlocked,
                            EngineFaulted)}
SEQ = itertools.count(1)  # a front end's numbers for requests and commands, across deployments


class DeploymentControls:
    name: str
    frontend: int
    sockets: list[zmq.Socket]
    resets: dict[int, asyncio.Future[bool]]
    controls: dict[int, asyncio.Future[m.Admission]]
    _reset_token: int

    # --- KV events (issue 13) ---
    async def reset_prefix_cache(self, timeout_s: float = 10.0, reset_running: bool = False,
                                 reset_external: bool = False) -> bool:
        """vLLM's reset_prefix_cache on every rank: True when every rank emptied its cache
        (refused where requests hold blocks, unless `reset_running` preempts the running ones
        first; a rank not answering counts as refused); `reset_external`: and its CPU
        offloading tier (refused while a load holds blocks)."""
        loop = asyncio.get_running_loop()
        waits = []
        for sock in self.sockets:
            self._reset_token += 1
            fut: asyncio.Future[bool] = loop.create_future()
            self.resets[self._reset_token] = fut
            waits.append(fut)
            try:
                sock.send(m.encode(m.ResetPrefixCache(self.frontend, self._reset_token,
                                                      reset_running, reset_external)),
                          zmq.NOBLOCK)
            except zmq.Again:
                fut.set_result(False)
        try:
            return all(await asyncio.wait_for(asyncio.gather(*waits), timeout_s))
        except TimeoutError:
            return False
        finally:
            for token in [t for t, f in self.resets.items() if f in waits]:
                del self.resets[token]

    # ---- sleep mode (issue 13) and pausing generation ----------------------------------------
    async def control(self, make: Callable[[int, int], m.Sleep | m.WakeUp | m.ReleaseKvCache
                                           | m.Profile | m.WeightVersion | m.Pause | m.Resume
                                           | m.Checkpoint]
                      ) -> list[m.Admission]:
        """Send a sleep-mode or pause command to every rank and wait for each engine's answer
        (an `Admissions` item for its seq); raises the engine's typed error if one refused,
        Unavailable if a rank died before answering."""
        loop = asyncio.get_running_loop()
        futures = []
        for sock in self.sockets:
            seq = next(SEQ)
            future: asyncio.Future[m.Admission] = loop.create_future()
            self.controls[seq] = future
            try:
                sock.send(m.encode(make(self.frontend, seq)), zmq.NOBLOCK)
            except zmq.Again:
                self.controls.pop(seq, None)
                raise Unavailable(f"deployment {self.name!r}: its engine process is not "
                                  "reachable") from None
            futures.append(future)
        answers = await asyncio.gather(*futures)
        for answer in answers:
            if answer.error:
                raise ERRORS.get(answer.error, Unavailable)(answer.message)
        return answers
