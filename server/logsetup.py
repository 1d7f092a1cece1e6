"""Logging for every process of one server: one format, one stream (the server's stderr), and
a tag naming the process (`supervisor`, `frontend[0]`, `engine[vllm-h100/0]`), so a traceback
from any process lands, attributed, in the one server log."""

from __future__ import annotations

import logging
import sys


def configure_logging(level: str, process: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()), stream=sys.stderr, force=True,
        format=f"%(asctime)s %(levelname)s {process} %(name)s: %(message)s",
    )
