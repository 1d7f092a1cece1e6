"""The supervisor's forkserver, started as early as the command can start it.

Why it exists: every engine and front-end process is forked from one forkserver that has
imported `server.preload` (the front end's and engine's modules, the tokenizer: about a
second of CPU). Started by the supervisor, that second comes after the supervisor's own
imports and the fleet's parsing; started here first, by `doppelchip serve` before it imports
anything heavy, it runs on the other core meanwhile. Light on purpose: only the standard
library. No thread or socket exists yet when it runs, as a forkserver needs.
"""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing import forkserver
from multiprocessing.context import BaseContext

PRELOAD = ["server.preload"]


def context() -> BaseContext:
    """The forkserver context, with the preload set (before the server first starts)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def start_early() -> None:
    """Start the forkserver now; it preloads while the caller goes on (the first fork waits
    for it). A later `context()` finds it running."""
    context()
    forkserver.ensure_running()
