"""What a TensorRT-LLM pod's front end records for TensorRT-LLM's request series
(`server.stats.schema_trtllm`), in the same stats block as vLLM's and in the same write, as
trtllm-serve records them: once a request has finished, from its timeline
(`GenerationResult.record_stats` -> `_process_req_perf_metrics` -> `MetricsCollector.
log_request_metrics_dict`, TensorRT-LLM 1.3):

- only a request that stopped or hit its length (a cancelled or failed one logs nothing);
- time to first token = queue + prefill, end to end = queue + prefill + decode, inference =
  prefill + decode (its arrival, first scheduled, first and last token times);
- a value that is not positive is not observed (`filter(item[1] > 0)`), so a request that never
  queued adds nothing to the queue histogram; time per output token only with more than one
  token and n = 1 (decode time over the tokens after the first);
- cached prompt tokens: the counter when some were cached, the histogram always.
"""

from __future__ import annotations

import numpy as np

from server.stats.layout import HistogramWriter, Layout
from server.stats.schema_trtllm import FINISHED_REASONS

_HISTS = ("trtllm_e2e_request_latency_seconds", "trtllm_time_to_first_token_seconds",
          "trtllm_time_per_output_token_seconds", "trtllm_request_queue_time_seconds",
          "trtllm_request_prefill_time_seconds", "trtllm_request_decode_time_seconds",
          "trtllm_request_inference_time_seconds")


class TrtllmRequestStats:
    """The trtllm_ slots of one (deployment, rank) block."""

    def __init__(self, view: np.ndarray, layout: Layout) -> None:
        self.a = view
        self.success = {r: layout.slot("trtllm_request_success", r) for r in FINISHED_REASONS}
        self.hists = [HistogramWriter(view, layout, name) for name in _HISTS]
        self.prompt = layout.slot("trtllm_prompt_tokens")
        self.generation = layout.slot("trtllm_generation_tokens")
        self.cached = layout.slot("trtllm_prompt_cached_tokens")
        self.cached_hist = HistogramWriter(view, layout, "trtllm_prompt_cached_tokens_per_request")

    def finished(self, reason: str, queue: float, prefill: float, decode: float,
                 prompt_tokens: int, generation_tokens: int, cached: int, n: int) -> None:
        if reason not in self.success:
            return
        a = self.a
        a[self.success[reason]] += 1
        tpot = decode / (generation_tokens - 1) if generation_tokens > 1 and n == 1 else 0.0
        values = (queue + prefill + decode, queue + prefill, tpot, queue, prefill, decode,
                  prefill + decode)
        for hist, value in zip(self.hists, values, strict=True):
            if value > 0:
                hist.observe(value)
        a[self.prompt] += prompt_tokens
        a[self.generation] += generation_tokens
        a[self.cached] += cached
        self.cached_hist.observe(cached)
