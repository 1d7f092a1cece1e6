"""A child process's lifeline to its supervisor: when the supervisor is gone, however it went
(SIGKILL, OOM, a crash), the child exits too.

Why: engines and front ends are forked by the multiprocessing forkserver, not by the
supervisor, so the kernel's parent-death signal cannot name the supervisor; without this, a
killed supervisor leaves engines and front ends running, holding their ports and memory. A
daemon thread waits on a pidfd of the supervisor (Linux >= 5.3; elsewhere it polls once a
second) and ends the process with `os._exit`: there is nobody left to drain to.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time

log = logging.getLogger("doppelchip.lifeline")
EXIT_CODE = 70  # EX_SOFTWARE: the process did not end by its own decision


def exit_with(pid: int) -> None:
    """Exit this process as soon as process `pid` has ended (at once if it already has)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        _exit(pid)
    except (AttributeError, OSError):  # no pidfd here: poll
        threading.Thread(target=_poll, args=(pid,), name="lifeline", daemon=True).start()
    else:
        threading.Thread(target=_wait, args=(pid, fd), name="lifeline", daemon=True).start()


def _wait(pid: int, fd: int) -> None:
    select.select([fd], [], [])  # readable once the process has ended
    _exit(pid)


def _poll(pid: int) -> None:
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _exit(pid)
        time.sleep(1.0)  # a liveness poll, not a synchronisation


def _exit(pid: int) -> None:
    log.error("supervisor (pid %d) is gone; exiting", pid)
    logging.shutdown()
    os._exit(EXIT_CODE)
