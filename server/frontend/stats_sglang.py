"""What an SGLang pod's front end records for SGLang's metrics (`server.stats.schema_sglang`),
in the same stats block as vLLM's and in the same writes, as SGLang's tokenizer manager
records them (`TokenizerManager.collect_metrics`, sglang 0.5.23):

- the first output of a request: its time to first token, by `is_streaming`;
- each later output: the interval over its new tokens (`observe_inter_token_latency`);
- its finish (`observe_one_finished_request`): prompt, generation and request counts and the
  end-to-end latency by `is_streaming`, the time per output token when it stopped or hit its
  length (not when aborted), the length histograms, cached tokens by source, structured
  output requests, its speculative verification steps (`spec_verify_calls`, when it had
  any); an abort also counts in `num_aborted_requests`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from server.stats.layout import HistogramWriter, Layout
from server.stats.schema_sglang import STREAMING


class SglangRequestStats:
    """The sglang: slots of one (deployment, rank) block."""

    def __init__(self, view: np.ndarray, layout: Layout) -> None:
        self.a = view

        def by_stream(name: str) -> tuple[int, int]:
            return (layout.slot(name, STREAMING[0]), layout.slot(name, STREAMING[1]))

        def hists(name: str) -> tuple[HistogramWriter, HistogramWriter]:
            return (HistogramWriter(view, layout, name, STREAMING[0]),
                    HistogramWriter(view, layout, name, STREAMING[1]))

        self.prompt = by_stream("sglang:prompt_tokens")
        self.generation = by_stream("sglang:generation_tokens")
        self.requests = by_stream("sglang:num_requests")
        self.cached_device = layout.slot("sglang:cached_tokens", "device")
        self.structured = layout.slot("sglang:num_so_requests")
        self.aborted = layout.slot("sglang:num_aborted_requests")
        self.verify_calls = layout.slot("sglang:spec_verify_calls")
        self.ttft = hists("sglang:time_to_first_token_seconds")
        self.tpot = hists("sglang:request_time_per_output_token_seconds")
        self.e2e = hists("sglang:e2e_request_latency_seconds")
        self.itl = HistogramWriter(view, layout, "sglang:inter_token_latency_seconds")
        self.prompt_len = HistogramWriter(view, layout, "sglang:prompt_tokens_histogram")
        self.uncached_len = HistogramWriter(view, layout,
                                            "sglang:uncached_prompt_tokens_histogram")
        self.output_len = HistogramWriter(view, layout, "sglang:generation_tokens_histogram")
        self.queue = HistogramWriter(view, layout, "sglang:queue_time_seconds")

    def step(self, ttfts: Sequence[float], streaming: Sequence[bool], itl: Sequence[float],
             itl_n: Sequence[int]) -> None:
        for value, stream in zip(ttfts, streaming, strict=True):
            self.ttft[stream].observe(value)
        self.itl.observe_many(itl, itl_n)

    def finished(self, reason: str, e2e: float, queue: float, decode: float,
                 prompt_tokens: int, generation_tokens: int, cached: int, stream: bool,
                 structured: bool, verify_calls: int = 0) -> None:
        a, s = self.a, int(stream)
        a[self.verify_calls] += verify_calls
        a[self.prompt[s]] += prompt_tokens
        a[self.generation[s]] += generation_tokens
        a[self.requests[s]] += 1
        a[self.cached_device] += cached
        if structured:
            a[self.structured] += 1
        if reason == "abort":
            a[self.aborted] += 1
        self.e2e[s].observe(e2e)
        if reason in ("stop", "length") and generation_tokens > 1:
            self.tpot[s].observe(decode / (generation_tokens - 1))
        self.prompt_len.observe(prompt_tokens)
        self.uncached_len.observe(prompt_tokens - cached)
        self.output_len.observe(generation_tokens)
        self.queue.observe(queue)
