"""Logging for every process of one server: one format, one stream (the server's stderr), and
a tag naming the process (`supervisor`, `frontend[0]`, `engine[vllm-h100/0]`), so a traceback
from any process lands, attributed, in the one server log.

Messages are escaped: a request id, a deployment name or any client text with a newline, a
carriage return or an ANSI escape cannot forge or recolour a log line — control characters
(and the backslash) in a message are written as Python escapes (`\\n`, `\\x1b`). Tracebacks
(the exception text after the message) are the server's own and stay multi-line.
"""

from __future__ import annotations

import logging
import re
import sys

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\\]")


def escape(text: str) -> str:
    """`text` with every control character (C0, DEL, C1) and backslash escaped."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class EscapingFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)


def configure_logging(level: str, process: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(EscapingFormatter(
        f"%(asctime)s %(levelname)s {process} %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler], force=True)
