"""What every route of one front end reads, and the vLLM version its API follows."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from server.engine.tokenizer import Tokenizer
from server.fleet import Fleet
from server.http.parser_metrics import ToolParserMetrics
from server.http.responses_store import ResponseStore
from server.metrics import MetricsView

VLLM_VERSION = "0.34.0"  # the vLLM release whose HTTP API this mirrors (docs/HTTP.md)


@dataclass
class HttpState:
    """The fleet, the tokenizer, the metrics view, and whether the front end is draining (new
    requests get 503, /health turns 503); with load tracking (vLLM's
    --enable-server-load-tracking) the completions and chat requests in flight, which GET /load
    reports."""

    fleet: Fleet
    tokenizer: Tokenizer
    metrics: MetricsView
    draining: bool = False
    load_tracking: bool = False
    server_load: int = 0
    responses: ResponseStore | None = None  # VLLM_ENABLE_RESPONSES_API_STORE=1 (vLLM's)
    scale_out: bool = False  # --enable-scale-out (vLLM's): render and generate routes
    now: Callable[[], float] = time.monotonic  # the emulated timeline (the front end's clock)
    profiler: bool = False  # --profiler-config (vLLM's): /start_profile and /stop_profile
    tokenizer_info: bool = False  # --enable-tokenizer-info-endpoint (vLLM's)
    checkpoint: bool = False  # --enable-sleep-mode (vLLM 0.34.0's): the /checkpoint/* routes
    fault_tolerance: bool = False  # --enable-fault-tolerance (vLLM 0.34.0's): its two routes
    force_include_usage: bool = False  # --enable-force-include-usage (vLLM's)
    sse_keep_alive_s: float = 0.0  # --sse-keep-alive-interval (vLLM's): 0 sends none
    per_request_metrics: bool = False  # --enable-per-request-metrics (vLLM's): `metrics`
    response_role: str = "assistant"  # --response-role (vLLM's)
    tokens_as_ids: bool = False  # --return-tokens-as-token-ids (vLLM's): requests' default
    tool_parser: ToolParserMetrics | None = None  # --tool-call-parser (vLLM's metric)
    enable_metrics: bool = True  # /metrics mounted (an SGLang pod: its --enable-metrics)
    vllm_api: bool = True  # the front end speaks vLLM's API (not an SGLang or TRT-LLM pod's)

    def load(self) -> InFlight:
        """One request in flight from now (`InFlight.done` ends it)."""
        return InFlight(self)


class InFlight:
    """One request counted in `HttpState.server_load` until `done()`: vLLM's
    `load_aware_call`, which counts a request from its handler's start until its response has
    been sent (a stream's last byte, or the client gone). `done` ends it once, however often
    it is called."""

    def __init__(self, state: HttpState) -> None:
        self.state = state if state.load_tracking else None
        if self.state is not None:
            self.state.server_load += 1

    def done(self) -> None:
        if self.state is not None:
            self.state.server_load -= 1
            self.state = None
