"""The supervisor while serving: children's deaths and restarts, read from the event loop.

Each child's process sentinel (a file descriptor readable once the process ends) and the
supervisor's own ZeroMQ inbox are watched with `add_reader`; nothing polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import zmq

from server.ipc import messages as m
from server.supervisor_engines import EngineSlot, crash_message

if TYPE_CHECKING:
    from server.supervisor import Supervisor

log = logging.getLogger("doppelchip.server")


class Watcher:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.loop = asyncio.get_running_loop()
        self._fds: list[int] = []

    def start(self) -> None:
        for slot in self.sup.engines.values():
            self.watch_engine(slot)
        for i in self.sup.frontends:
            self.watch_frontend(i)
        fd = self.sup.inbox.getsockopt(zmq.FD)
        self.loop.add_reader(fd, self._inbox)
        self._fds.append(fd)
        self.loop.call_soon(self._inbox)

    def stop(self) -> None:
        for fd in self._fds:
            self.loop.remove_reader(fd)
        self._fds.clear()

    def _watch(self, proc, callback) -> None:
        fd = proc.sentinel
        self._fds.append(fd)

        def ended() -> None:
            self.loop.remove_reader(fd)
            if fd in self._fds:
                self._fds.remove(fd)
            proc.join(0)
            callback()

        self.loop.add_reader(fd, ended)

    # ---- engines ----------------------------------------------------------------------------
    def watch_engine(self, slot: EngineSlot) -> None:
        if slot.process is not None and slot.process.is_alive():
            self._watch(slot.process, lambda: self._engine_ended(slot))

    def _engine_ended(self, slot: EngineSlot) -> None:
        sup = self.sup
        if sup.stopping:
            return
        code = slot.process.exitcode if slot.process is not None else None
        if slot.permanent_failure and code == 0:
            return  # could not be placed: it said so and left
        backoff = slot.next_backoff(sup.config.server.engine_restart_backoff_s)
        message = (f"engine process exited ({crash_message(code)}); restarting in "
                   f"{backoff:.1f} s")
        log.error("deployment %s rank %d: %s", slot.options.name, slot.rank, message)
        info = slot.info or sup.frontend_infos[slot.deployment][slot.rank]
        slot.mark_failed(sup.run_dir, info, message)
        for sock in sup.to_frontends:
            with contextlib.suppress(zmq.Again):
                sock.send(m.encode(m.EngineDown(slot.deployment, slot.rank, slot.epoch,
                                                message)), zmq.NOBLOCK)
        self.loop.call_later(backoff, self._restart_engine, slot)

    def _restart_engine(self, slot: EngineSlot) -> None:
        if self.sup.stopping:
            return
        slot.epoch += 1
        log.info("restarting the engine of %s rank %d (epoch %d)", slot.options.name,
                 slot.rank, slot.epoch)
        self.sup._start_engine(slot, cold=True)
        self.watch_engine(slot)

    # ---- front ends -------------------------------------------------------------------------
    def watch_frontend(self, i: int) -> None:
        proc = self.sup.frontends[i]
        if proc.is_alive():
            self._watch(proc, lambda: self._frontend_ended(i))

    def _frontend_ended(self, i: int) -> None:
        sup = self.sup
        if sup.stopping:
            return
        code = sup.frontends[i].exitcode
        log.error("front end %d exited (%s); aborting its requests and restarting it", i,
                  crash_message(code))
        for key in sup.engines:
            sock = sup.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 500)
            sock.connect(sup.run_dir.engine_input(*key))
            sock.send(m.encode(m.FrontendGone(i)))
            sock.close()
        self.loop.call_later(sup.config.server.engine_restart_backoff_s,
                             self._restart_frontend, i)

    def _restart_frontend(self, i: int) -> None:
        if self.sup.stopping:
            return
        self.sup._start_frontend(i)
        self.watch_frontend(i)

    # ---- messages ---------------------------------------------------------------------------
    def _inbox(self) -> None:
        sock = self.sup.inbox
        while True:
            try:
                msg = m.to_supervisor(sock.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
            if isinstance(msg, m.EngineHello):
                slot = self.sup.engines[(msg.deployment, msg.rank)]
                slot.hello(msg)
                log.info("engine of %s rank %d is back (pid %d)", slot.options.name,
                         msg.rank, msg.pid)
            elif isinstance(msg, m.FrontendHello) and msg.error:
                log.error("front end %d could not start: %s", msg.frontend, msg.error)
        if sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self.loop.call_soon(self._inbox)
