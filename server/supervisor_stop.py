"""Step 5 of the supervisor's lifecycle (`server/supervisor.py`): stopping its children.

The front ends go first (SIGTERM: each drains — health NOT_SERVING, new calls UNAVAILABLE,
in-flight streams finish or are aborted at `drain_grace_s`), then every engine gets a
`Shutdown` message on its input socket; a child still alive at its deadline is killed. Last,
the run directory (the IPC sockets) is removed.

Why it exists apart from `supervisor.py`: the order and the deadlines of a shutdown are one
concern, read and changed on their own; the supervisor decides when, this module how.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import TYPE_CHECKING

import zmq

from server.ipc import messages as m

if TYPE_CHECKING:
    from server.supervisor import Supervisor

log = logging.getLogger("doppelchip.server")

ENGINE_STOP_S = 10.0  # an engine's time to stop once told (it has no stream left by then)


async def stop_children(sup: Supervisor) -> None:
    """Stop `sup`'s front ends, then its engines (see the module docstring)."""
    grace = sup.config.server.drain_grace_s
    for proc in sup.frontends.values():
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGTERM)
    await join(list(sup.frontends.values()), grace + 10.0)
    for key, slot in sup.engines.items():
        if slot.process is not None and slot.process.is_alive():
            sock = sup.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(sup.run_dir.engine_input(*key))
            sock.send(m.encode(m.Shutdown()))
            sock.close()
    await join([s.process for s in sup.engines.values() if s.process], ENGINE_STOP_S)
    sup.run_dir.remove()
    log.info("stopped")


async def join(procs: list, timeout: float) -> None:
    """Wait for the processes to exit; kill what is left at the timeout."""
    deadline = time.monotonic() + timeout
    for p in procs:
        left = max(0.0, deadline - time.monotonic())
        await asyncio.to_thread(p.join, left)
        if p.is_alive():
            log.warning("%s did not stop in time: killing it", p.name)
            p.kill()
            await asyncio.to_thread(p.join, 5.0)
