"""vLLM's `vllm:tool_call_parser_invocations_total` (`vllm/parser/metrics.py` at v0.33.0),
registered as vLLM registers it: at start-up when `--tool-call-parser` is given, every one of
its 12 label combinations at 0 for each served model name.

vLLM counts a tool parser's runs: once per choice of a non-streamed answer, once per delta of
a stream, for the requests whose `tool_choice` is "auto" (the other choices are structured
output, no parser runs); `outcome` is whether that run found a tool call, `request_type` the
API (`chat_completions` — also the Messages API and SageMaker's, which vLLM serves as chat
requests —, `responses`). doppelchip decides "auto" by its own rule (docs/HTTP.md, Tool
calls) and counts where vLLM's parser would run. The counter lives in prometheus_client's
multiprocess files with the HTTP series, one view over every front end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import product

from prometheus_client import CollectorRegistry, Counter

MODES = ("streaming", "non_streaming")
OUTCOMES = ("tool_call", "no_tool_call")
REQUEST_TYPES = ("chat_completions", "responses", "other")

# a request's recorder: (streaming, a tool call found) -> None
Recorder = Callable[[bool, bool], None]


class ToolParserMetrics:
    def __init__(self, model_names: Iterable[str]) -> None:
        self.counter = Counter(
            "vllm:tool_call_parser_invocations_total",
            "Total number of ToolParser invocations. Non-streaming increments once per choice; "
            "streaming increments once per delta.",
            ["model_name", "mode", "outcome", "request_type"],
            registry=CollectorRegistry(auto_describe=False))  # the multiprocess files hold it
        for name, mode, outcome, kind in product(set(model_names), MODES, OUTCOMES,
                                                 REQUEST_TYPES):
            self.counter.labels(name, mode, outcome, kind)

    def recorder(self, model_name: str, request_type: str) -> Recorder:
        children = {(streaming, called): self.counter.labels(
            model_name, "streaming" if streaming else "non_streaming",
            "tool_call" if called else "no_tool_call", request_type)
            for streaming in (True, False) for called in (True, False)}
        return lambda streaming, called: children[streaming, called].inc()
