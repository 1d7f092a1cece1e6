"""What every route of one front end reads, and the vLLM version its API follows."""

from __future__ import annotations

from dataclasses import dataclass

from server.engine.tokenizer import Tokenizer
from server.fleet import Fleet
from server.metrics import MetricsView

VLLM_VERSION = "0.33.0"  # the vLLM release whose HTTP API this mirrors (docs/HTTP.md)


@dataclass
class HttpState:
    """The fleet, the tokenizer, the metrics view, and whether the front end is draining (new
    requests get 503, /health turns 503)."""

    fleet: Fleet
    tokenizer: Tokenizer
    metrics: MetricsView
    draining: bool = False
