"""Client request ids: what is accepted, how it is echoed, and who may abort what.

Why a module of its own: an id travels into logs, into gRPC metadata (`x-request-id`) and into
the engine's in-flight set, and each has its own failure (a newline forges a log line, a
non-ASCII byte is invalid metadata — the write fails after the request was submitted, so
nobody reads it — a 1 MB id blows clients' 8 KB metadata limit). Every front door checks an
id here before anything is submitted.

Contract:
- `check(rid)`: at most 256 bytes of UTF-8 and no control character (Unicode category Cc),
  else InvalidRequest (INVALID_ARGUMENT / 400).
- `metadata_value(rid)`: the id as a valid gRPC metadata value — printable ASCII kept, every
  other byte and `%` percent-encoded (RFC 3986), so ASCII ids are echoed unchanged.
- `AbortBook`: aborts by id are owned. One book per service: an Abort may end a request only
  from the connection (`context.peer()`) that started it, or from a caller holding the API
  key. An Abort for an id this connection has not started yet is remembered for 30 s and
  ends that request at once when it arrives (the smg gateway cancels only through Abort, and
  its Abort can overtake its Generate). An Abort for an id this connection finished within
  those 30 s is not remembered, so it never reaches a later request reusing the id.
"""

from __future__ import annotations

import time
import unicodedata
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import quote

from server.engine.errors import InvalidRequest

MAX_ID_BYTES = 256
REMEMBER_S = 30.0
MAX_REMEMBERED = 4096  # per book: a flood of Aborts for unknown ids cannot grow it further
_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def check(rid: str) -> None:
    n = len(rid.encode("utf-8", "surrogatepass"))
    if n > MAX_ID_BYTES:
        raise InvalidRequest(f"request id is {n} bytes; at most {MAX_ID_BYTES} bytes of UTF-8")
    for ch in rid:
        if unicodedata.category(ch) in ("Cc", "Cs"):
            raise InvalidRequest(f"request id contains a control character (U+{ord(ch):04X})")


def metadata_value(rid: str) -> str:
    if rid.isascii() and rid.isprintable() and "%" not in rid:
        return rid
    return quote(rid, safe=_SAFE)


class AbortBook:
    """Owned aborts across one service's connections (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._pending: OrderedDict[tuple[str, str], float] = OrderedDict()  # early Aborts
        self._finished: OrderedDict[tuple[str, str], float] = OrderedDict()  # recent ends

    def _expire(self, book: OrderedDict[tuple[str, str], float]) -> None:
        now = self.clock()
        while book and (next(iter(book.values())) <= now or len(book) > MAX_REMEMBERED):
            book.popitem(last=False)

    def abort_unknown(self, peer: str, rid: str) -> None:
        """An Abort from `peer` for an id it has nothing in flight under: remember it, unless
        `peer` just finished a request with that id (the Abort came late, not early)."""
        self._expire(self._finished)
        if (peer, rid) in self._finished:
            return
        self._pending[(peer, rid)] = self.clock() + REMEMBER_S
        self._pending.move_to_end((peer, rid))
        self._expire(self._pending)

    def take_early_abort(self, peer: str, rid: str) -> bool:
        """Whether a request `rid` arriving from `peer` was aborted before it arrived (the
        remembered Abort is used up)."""
        self._expire(self._pending)
        return self._pending.pop((peer, rid), None) is not None

    def finished(self, peer: str, rid: str) -> None:
        """`peer`'s request `rid` ended (however): a late Abort for it is not remembered."""
        self._finished[(peer, rid)] = self.clock() + REMEMBER_S
        self._finished.move_to_end((peer, rid))
        self._expire(self._finished)
