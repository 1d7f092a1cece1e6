"""TensorRT-LLM's metrics (`--http-api trtllm --enable-metrics`): the `trtllm_` series
trtllm-serve exports on `/prometheus/metrics` when `return_perf_metrics` is on, as its
`MetricsCollector` names them (`tensorrt_llm/metrics/collector.py`): names, types, help
strings and default buckets, transcribed into `tests/observability/trtllm_reference.json`.

Who writes what, as there: the OpenAI server logs a request's series once it has finished
(`_extract_metrics` -> `log_request_metrics_dict`: its finish reason, the latencies of its
timeline, its tokens; a request that was cancelled or failed logs nothing); the iteration
series (`log_iteration_stats`: queue and load, KV-cache blocks, memory, batch limits) are
computed from the engine's slots at scrape time (`server.stats.collector_trtllm`).
"""

from __future__ import annotations

from server.stats.layout import MetricDef

FINISHED_REASONS = ("stop", "length")  # what reaches `_extract_metrics` (not cancelled)

LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
PREFILL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0,
                   40.0, 80.0, 160.0, 640.0, 2560.0)
CACHED_BUCKETS = (0.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0)

# What the front end writes per (deployment, rank) on a TensorRT-LLM pod, in the order the
# collector registers them. Names as `MetricDef`s take them: counters without `_total`.
TRTLLM_REQUEST_METRICS = (
    MetricDef("trtllm_request_success", "counter", "Count of successfully processed requests.",
              label="finished_reason", values=FINISHED_REASONS),
    MetricDef("trtllm_e2e_request_latency_seconds", "histogram",
              "Histogram of end to end request latency in seconds.", LATENCY_BUCKETS),
    MetricDef("trtllm_time_to_first_token_seconds", "histogram",
              "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    MetricDef("trtllm_time_per_output_token_seconds", "histogram",
              "Histogram of time per output token in seconds.", TPOT_BUCKETS),
    MetricDef("trtllm_request_queue_time_seconds", "histogram",
              "Histogram of time spent in WAITING phase for request.", LATENCY_BUCKETS),
    MetricDef("trtllm_request_prefill_time_seconds", "histogram",
              "Histogram of prefill (context) phase duration in seconds "
              "(first_token_time - first_scheduled_time).", PREFILL_BUCKETS),
    MetricDef("trtllm_request_decode_time_seconds", "histogram",
              "Histogram of decode (generation) phase duration in seconds "
              "(last_token_time - first_token_time).", LATENCY_BUCKETS),
    MetricDef("trtllm_request_inference_time_seconds", "histogram",
              "Histogram of total inference duration in seconds "
              "(last_token_time - first_scheduled_time).", LATENCY_BUCKETS),
    MetricDef("trtllm_prompt_tokens", "counter",
              "Cumulative number of prompt (input) tokens processed."),
    MetricDef("trtllm_generation_tokens", "counter",
              "Cumulative number of generation (output) tokens produced."),
    MetricDef("trtllm_prompt_cached_tokens", "counter",
              "Total prompt tokens served from KV cache."),
    MetricDef("trtllm_prompt_cached_tokens_per_request", "histogram",
              "Histogram of cached prompt tokens per request.", CACHED_BUCKETS),
)

# The iteration series (name -> (type, help)), from the engine's slots at scrape time.
ITERATION_SERIES: dict[str, tuple[str, str]] = {
    "trtllm_kv_cache_hit_rate": ("gauge", "KV cache hit rate"),
    "trtllm_kv_cache_reused_blocks": (
        "counter", "Cumulative number of KV cache blocks reused (cache hits)"),
    "trtllm_kv_cache_missed_blocks": (
        "counter", "Cumulative number of KV cache blocks missed (cache misses)"),
    "trtllm_kv_cache_utilization": ("gauge", "KV cache utilization"),
    "trtllm_num_requests_running": ("gauge", "Number of active requests"),
    "trtllm_num_requests_waiting": ("gauge", "Number of queued requests"),
    "trtllm_num_requests_completed": (
        "counter", "Total number of completed requests across iterations"),
    "trtllm_max_num_active_requests": ("gauge", "Maximum number of active requests"),
    "trtllm_iteration_latency_seconds": ("gauge", "Iteration latency in seconds"),
    "trtllm_gpu_memory_usage_bytes": ("gauge", "GPU memory usage in bytes"),
    "trtllm_cpu_memory_usage_bytes": ("gauge", "CPU memory usage in bytes"),
    "trtllm_pinned_memory_usage_bytes": ("gauge", "Pinned memory usage in bytes"),
    "trtllm_max_batch_size_static": ("gauge", "Static maximum batch size"),
    "trtllm_max_batch_size_runtime": ("gauge", "Runtime maximum batch size"),
    "trtllm_max_num_tokens_runtime": ("gauge", "Runtime maximum number of tokens"),
    "trtllm_kv_cache_max_blocks": ("gauge", "Maximum number of KV cache blocks"),
    "trtllm_kv_cache_free_blocks": ("gauge", "Number of free KV cache blocks"),
    "trtllm_kv_cache_used_blocks": ("gauge", "Number of used KV cache blocks"),
    "trtllm_kv_cache_tokens_per_block": ("gauge", "Number of tokens per KV cache block"),
}

# A speculating pod's series (name -> (type, help, extra label)): the iteration counters and
# gauges (`specDecodingStats`), and the per-request counters by draft position
SPEC_SERIES: dict[str, tuple[str, str, str | None]] = {
    "trtllm_spec_decode_num_draft_tokens": (
        "counter", "Total number of draft tokens in speculative decoding", None),
    "trtllm_spec_decode_num_accepted_tokens": (
        "counter", "Total number of accepted tokens in speculative decoding", None),
    "trtllm_spec_decode_acceptance_length": (
        "gauge", "Acceptance length in speculative decoding", None),
    "trtllm_spec_decode_draft_overhead": (
        "gauge", "Draft overhead in speculative decoding", None),
    "trtllm_spec_decode_drafted_tokens": (
        "counter", "Total drafted tokens per speculative decoding position.", "token_position"),
    "trtllm_spec_decode_accepted_tokens": (
        "counter", "Total accepted tokens per speculative decoding position.",
        "token_position"),
}

# The configuration, logged once at start-up as info gauges (value 1, the settings as labels),
# in TensorRT-LLM's order; the speculative one only for a pod that speculates.
CONFIG_INFO: dict[str, str] = {
    "trtllm_model_config_info": "Model configuration info",
    "trtllm_parallel_config_info": "Parallelism configuration info",
    "trtllm_speculative_config_info": "Speculative decoding configuration info",
    "trtllm_kv_cache_config_info": "KV cache configuration info",
}
