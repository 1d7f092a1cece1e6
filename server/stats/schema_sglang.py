"""SGLang's metrics (`--http-api sglang --enable-metrics`): the `sglang:` series an SGLang
0.5.23 server exports, as its `TokenizerMetricsCollector` and `SchedulerMetricsCollector` name
them (`sglang/srt/observability/metrics_collector.py`): names, types, help strings, extra
labels and default buckets, transcribed into `tests/observability/sglang_reference.json`.

Who writes what here, as there: the front end counts a request when it finishes (SGLang's
tokenizer manager, `observe_one_finished_request`: tokens, requests, end-to-end latency and
time per output token split by `is_streaming`, the length histograms, cached tokens by
`cache_source`, its speculative verification steps) and its first token when it arrives
(time to first token, by `is_streaming`);
inter-token latency per streamed step (interval / new tokens, as SGLang's
`observe_inter_token_latency`). The scheduler's gauges are read from the engine's vLLM-named
slots at scrape time (`server.stats.collector_sglang`).
"""

from __future__ import annotations

from server.stats.layout import MetricDef

STREAMING = ("false", "true")  # SGLang's `is_streaming` label values
CACHE_SOURCES = ("device", "host")  # `cached_tokens_details` without a storage tier

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600,
               1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
               0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000,
               8.000)
TOKEN_BUCKETS = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000,
                 9000, 10000, 12500, 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000,
                 40000, 60000, 80000, 100000, 200000, 300000, 400000, 600000, 800000, 1000000,
                 1100000)
QUEUE_BUCKETS = (0.0, 0.001, 0.005, 0.010, 0.050, 0.100, 0.200, 0.500, 1, 2, 3, 4, 5, 10, 15,
                 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900,
                 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000)


def _streaming(name: str, kind: str, doc: str, buckets: tuple[float, ...] = ()) -> MetricDef:
    return MetricDef(name, kind, doc, tuple(float(b) for b in buckets), label="is_streaming",
                     values=STREAMING)


# What the front end writes, per (deployment, rank), on an SGLang pod. Names as `MetricDef`s
# take them: counters without `_total`.
SGLANG_REQUEST_METRICS = (
    _streaming("sglang:prompt_tokens", "counter", "Number of prefill tokens processed."),
    _streaming("sglang:generation_tokens", "counter", "Number of generation tokens processed."),
    _streaming("sglang:num_requests", "counter", "Number of requests processed."),
    MetricDef("sglang:cached_tokens", "counter",
              "Number of cached prompt tokens by source (device/host/storage).",
              label="cache_source", values=CACHE_SOURCES),
    MetricDef("sglang:num_so_requests", "counter",
              "Number of structured output requests processed."),
    MetricDef("sglang:num_aborted_requests", "counter", "Number of requests aborted."),
    MetricDef("sglang:spec_verify_calls", "counter",
              "Number of speculative decoding verification calls."),
    _streaming("sglang:time_to_first_token_seconds", "histogram",
               "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    MetricDef("sglang:inter_token_latency_seconds", "histogram",
              "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    _streaming("sglang:request_time_per_output_token_seconds", "histogram",
               "Per-request TPOT in seconds: (finished_time - first_token_time) / "
               "(completion_tokens - 1).", ITL_BUCKETS),
    _streaming("sglang:e2e_request_latency_seconds", "histogram",
               "Histogram of End-to-end request latency in seconds", E2E_BUCKETS),
    MetricDef("sglang:prompt_tokens_histogram", "histogram",
              "Histogram of prompt token length.", tuple(map(float, TOKEN_BUCKETS))),
    MetricDef("sglang:uncached_prompt_tokens_histogram", "histogram",
              "Histogram of uncached (compute) prompt token length.",
              tuple(map(float, TOKEN_BUCKETS))),
    MetricDef("sglang:generation_tokens_histogram", "histogram",
              "Histogram of generation token length.", tuple(map(float, TOKEN_BUCKETS))),
    # the scheduler's in SGLang (its labels: `SCHEDULER_FAMILIES`); written at the finish here
    MetricDef("sglang:queue_time_seconds", "histogram",
              "Histogram of queueing time in seconds.", QUEUE_BUCKETS),
)

# The scheduler's gauges and counters (name -> (type, help)), computed at scrape time.
SCHEDULER_SERIES: dict[str, tuple[str, str]] = {
    "sglang:num_running_reqs": ("gauge", "The number of running requests."),
    "sglang:num_queue_reqs": ("gauge", "The number of requests in the waiting queue."),
    "sglang:gen_throughput": ("gauge", "The generation throughput (token/s)."),
    "sglang:cache_hit_rate": ("gauge", "The prefix cache hit rate."),
    "sglang:token_usage": ("gauge", "The token usage."),
    "sglang:num_used_tokens": ("gauge", "The number of used tokens."),
    "sglang:kv_used_tokens": ("gauge",
                              "Number of actively used token slots in the KV cache pool."),
    "sglang:num_retracted_requests": ("counter", "Total number of retracted requests."),
    "sglang:max_total_num_tokens": ("gauge",
                                    "Maximum total number of tokens in the KV cache pool."),
    "sglang:page_size": ("gauge", "KV cache page size in tokens."),
    "sglang:num_pages": ("gauge", "Number of KV cache pages."),
    "sglang:context_len": ("gauge", "Maximum context length."),
    "sglang:spec_accept_length": ("gauge", "Mean acceptance length of speculative decoding "
                                  "(accepted drafts + bonus token per forward)."),
    "sglang:spec_accept_rate": ("gauge", "Speculative acceptance rate (`accepted drafts / "
                                "proposed drafts` in batch)."),
}
# families SGLang's scheduler owns (their labels add tp_rank, pp_rank, moe_ep_rank, dp_rank)
SCHEDULER_FAMILIES = frozenset({*SCHEDULER_SERIES, "sglang:queue_time_seconds"})
