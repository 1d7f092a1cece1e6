"""A front end's request-level metrics: one stats file per front-end process, one block per
(deployment, rank), written once per engine step message — never a call per token.

What vLLM v1's output processor counts, with its semantics: prompt tokens when a request's
first token arrives, generation tokens as they are processed (tokens after a matched stop
string are not), TTFT and inter-token latency per step (a step that brought a request n
tokens records interval/n, n times), and at the finish the end-to-end, queue, prefill,
decode and inference times, prompt and generation lengths, the max_tokens parameter and the
finish reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from server.frontend.stats_sglang import SglangRequestStats
from server.frontend.stats_trtllm import TrtllmRequestStats
from server.stats.buckets import Overrides
from server.stats.layout import HistogramWriter, Layout
from server.stats.schema import request_metrics
from server.stats.shm import StatsFile

_FINISH_HISTS = ("vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                 "vllm:request_inference_time_seconds", "vllm:request_prompt_tokens",
                 "vllm:request_generation_tokens", "vllm:request_max_num_generation_tokens",
                 "vllm:request_params_n", "vllm:request_time_per_output_token_seconds",
                 "vllm:request_num_preemptions", "vllm:request_prefill_kv_computed_tokens",
                 "vllm:request_params_max_tokens")


class RequestStatsBlock:
    """The slots of one (deployment, rank) inside a front end's stats array."""

    def __init__(self, array, layout: Layout, base: int) -> None:
        view = array[base : base + layout.size]
        self.a = view
        self.prompt = layout.slot("vllm:prompt_tokens")
        self.cached = layout.slot("vllm:prompt_tokens_cached")
        self.by_source = {s: layout.slot("vllm:prompt_tokens_by_source", s)
                          for s in layout.defs["vllm:prompt_tokens_by_source"].values}
        self.generation = layout.slot("vllm:generation_tokens")
        self.success = {r: layout.slot("vllm:request_success", r)
                        for r in layout.defs["vllm:request_success"].values}
        self.ttft = HistogramWriter(view, layout, "vllm:time_to_first_token_seconds")
        self.itl = HistogramWriter(view, layout, "vllm:inter_token_latency_seconds")
        self.fine_itl = HistogramWriter(view, layout, "doppelchip_inter_token_latency_seconds")
        self.finish = [HistogramWriter(view, layout, n) for n in _FINISH_HISTS]
        self.sglang = (SglangRequestStats(view, layout)  # an SGLang pod's series
                       if "sglang:num_requests" in layout.defs else None)
        self.trtllm = (TrtllmRequestStats(view, layout)  # a TensorRT-LLM pod's
                       if "trtllm_request_success" in layout.defs else None)

    def step(self, generation: int, prompt: int, cached: int, ttfts: Sequence[float],
             itl: Sequence[float], itl_n: Sequence[int], external: int = 0,
             streaming: Sequence[bool] = ()) -> None:
        """One step message: tokens generated; for the requests that got their first token in
        it, their prompt tokens (and how many of those came from the prefix cache; of those,
        `external` arrived by a P/D KV transfer, vLLM's external_kv_transfer source) and
        whether each of those `ttfts` was asked as a stream (SGLang's label)."""
        a = self.a
        a[self.generation] += generation
        a[self.prompt] += prompt
        if prompt:
            a[self.cached] += cached
            a[self.by_source["local_compute"]] += prompt - cached
            a[self.by_source["local_cache_hit"]] += cached - external
            a[self.by_source["external_kv_transfer"]] += external
        self.ttft.observe_many(ttfts)
        self.itl.observe_many(itl, itl_n)
        self.fine_itl.observe_many(itl, itl_n)
        if self.sglang is not None:
            self.sglang.step(ttfts, streaming, itl, itl_n)

    def finished(self, reason: str, e2e: float, queue: float, prefill: float, decode: float,
                 prompt_tokens: int, generation_tokens: int, max_tokens: int | None,
                 cached: int = 0, preemptions: int = 0, n: int = 1, stream: bool = False,
                 structured: bool = False, verify_calls: int = 0) -> None:
        """A request ended: vLLM's per-request histograms (with n = 1 the parent's maximum
        generation length is this request's; time per output token is the decode time over
        the tokens after the first, 0 with one token or none); `verify_calls`: its speculative
        verification steps (SGLang's counter)."""
        self.a[self.success[reason]] += 1
        tpot = decode / (generation_tokens - 1) if generation_tokens > 1 else 0.0
        values = (e2e, queue, prefill, decode, prefill + decode, prompt_tokens,
                  generation_tokens, generation_tokens, n, tpot, preemptions,
                  prompt_tokens - cached)
        for h, v in zip(self.finish, values, strict=False):
            h.observe(v)
        if max_tokens:
            self.finish[-1].observe(max_tokens)
        if self.sglang is not None:
            self.sglang.finished(reason, e2e, queue, decode, prompt_tokens, generation_tokens,
                                 cached, stream, structured, verify_calls)
        if self.trtllm is not None:
            self.trtllm.finished(reason, queue, prefill, decode, prompt_tokens,
                                 generation_tokens, cached, n)


class FrontendStats:
    """The stats file of one front end: a block per (deployment, rank) in fleet order."""

    def __init__(self, path: Path, keys: Sequence[tuple[int, int]], max_model_len: int,
                 faults: bool = False, buckets: Overrides | None = None,
                 series: str = "vllm") -> None:
        self.layout = Layout(request_metrics(max_model_len, faults, buckets, series))
        self.keys = list(keys)
        self.file = StatsFile(path, self.layout.size * len(self.keys), create=True)
        self.blocks = {key: RequestStatsBlock(self.file.values, self.layout,
                                              i * self.layout.size)
                       for i, key in enumerate(self.keys)}
        self._depth = 0

    def begin(self) -> None:
        """Open an update (nested updates publish once, when the outermost ends)."""
        if self._depth == 0:
            self.file.begin()
        self._depth += 1

    def end(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.file.end()
