"""Every log line about a request carries its request id."""

from __future__ import annotations

import logging


def request_log(logger: logging.Logger, request_id: str) -> logging.LoggerAdapter:
    """A logger whose lines start with ``[request_id=…]``."""
    return _RequestAdapter(logger, {"request_id": request_id})


class _RequestAdapter(logging.LoggerAdapter):
    def process(self, msg, kwargs):  # type: ignore[override]
        extra = self.extra or {}
        return f"[request_id={extra.get('request_id')}] {msg}", kwargs
