"""Every log line about a request carries its request id.

An id too long to be valid (anything beyond 256 bytes is refused: `server.frontend.request_ids`)
is shown cut to its first 64 characters and its length, so the line that logs its refusal is
not itself a megabyte. A `%` in an id is doubled: the prefix becomes part of the message's
%-format, and a client's `%s` must not break it.
"""

from __future__ import annotations

import logging

SHOWN_CHARS = 256  # ids up to this many characters are logged whole
CUT_TO = 64


def shown_id(request_id: str) -> str:
    if len(request_id) <= SHOWN_CHARS:
        return request_id
    return f"{request_id[:CUT_TO]}…({len(request_id)} characters)"


def request_log(logger: logging.Logger, request_id: str) -> logging.LoggerAdapter:
    """A logger whose lines start with ``[request_id=…]``."""
    return _RequestAdapter(logger, {"request_id": shown_id(request_id).replace("%", "%%")})


class _RequestAdapter(logging.LoggerAdapter):
    def process(self, msg, kwargs):  # type: ignore[override]
        extra = self.extra or {}
        return f"[request_id={extra.get('request_id')}] {msg}", kwargs
