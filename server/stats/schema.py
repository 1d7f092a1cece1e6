"""Every metric doppelchip exports: vLLM's v1 set (names, types, help strings, buckets) and
doppelchip's device metrics, split by who writes them.

- `engine_metrics(info)`: written by the engine-core process once per step (scheduler
  gauges, prefix-cache and preemption counters, iteration tokens, device counters, energy);
  plus internal slots (`_state`, `_epoch`, ...) that carry the deployment's status to the
  front ends and are not exported.
- `request_metrics(max_model_len)`: written by each front end once per engine step message
  (vLLM v1 computes these in its front end's output processor too): token counters, finishes
  by reason, TTFT, inter-token latency, end-to-end and phase histograms.

vLLM sources (github.com/vllm-project/vllm), transcribed into
`tests/observability/vllm_reference.json`, which `test_obs_vllm_spec.py` holds this module
to: names, types, help strings, label names and bucket choice from `vllm/v1/metrics/loggers.py`
at 005a810bc40faa25b8870fbc8559c3462581eee3; bucket boundaries from
`vllm/v1/metrics/buckets.py` at 139b1c3f17720f4bb6865309f365e6b1f1607a45; the intervals from
`docs/design/metrics.md` at 0328b592a3d35f9b4dc5549d2a3fb8d1531c8e5f ("Interval
Calculations"). Labels: `model_name`, `engine` (the engine index: the data-parallel rank)
and `deployment`; device metrics use `deployment` and `chip`.
"""

from __future__ import annotations

from server.ipc.deployment import DeploymentInfo
from server.stats.buckets import Overrides, family_buckets
from server.stats.layout import MetricDef
from server.stats.schema_features import (
    FAULT_ENGINE_METRICS,
    FAULT_REQUEST_METRICS,
    NIXL_METRICS,
    OFFLOAD_METRICS,
    pd_sleep_metrics,
)
from server.stats.schema_sglang import SGLANG_REQUEST_METRICS
from server.stats.schema_trtllm import TRTLLM_REQUEST_METRICS

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
WAITING_REASONS = ("capacity", "deferred")
# vLLM 0.33.0 vllm/v1/metrics/stats.py KV_FETCH_STAGES: an async KV load's stages
KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
BOUNDS = ("memory", "compute", "overhead", "link")
COMPILE_REASONS = ("cold_start", "recompile", "new_shape", "other")
STATE_CODES = ("compiling", "ready", "failed", "draining")

# 50 µs … 10 ms: an SRAM chip's decode step (Groq, Cerebras) and a GPU's at batch 1 are under
# vLLM's first bucket (10 ms); from there on vLLM's own inter-token histogram resolves them
# (and a pod's scrape stays small).
FINE_ITL_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0025, 0.005, 0.0075,
                    0.01)
# 100 µs … 300 s in 1-5 steps: from a Cerebras decode step to a llama.cpp SSD-offload prefill
STEP_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 300.0)


# name -> (help, its bucket family: server/stats/buckets.py)
HISTOGRAMS: dict[str, tuple[str, str]] = {
    "vllm:request_prompt_tokens": ("Number of prefill tokens processed.", "request_tokens"),
    "vllm:request_generation_tokens": ("Number of generation tokens processed.", "request_tokens"),
    "vllm:iteration_tokens_total": ("Histogram of number of tokens per engine_step.",
                                    "iteration_tokens"),
    "vllm:request_params_max_tokens": ("Histogram of the max_tokens request parameter.",
                                       "request_tokens"),
    "vllm:time_to_first_token_seconds": ("Histogram of time to first token in seconds.",
                                         "time_to_first_token"),
    "vllm:inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.",
                                         "inter_token_latency"),
    "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.",
                                         "request_latency"),
    "vllm:request_queue_time_seconds": ("Histogram of time spent in WAITING phase for request.",
                                        "request_latency"),
    "vllm:request_inference_time_seconds": (
        "Histogram of time spent in RUNNING phase for request.", "request_latency"),
    "vllm:request_prefill_time_seconds": (
        "Histogram of time spent in PREFILL phase for request.", "request_latency"),
    "vllm:request_decode_time_seconds": (
        "Histogram of time spent in DECODE phase for request.", "request_latency"),
}
# vLLM 0.33.0 (docs/VLLM_REFERENCE.md, tests/observability/vllm_reference.json "series")
HISTOGRAMS_0_33: dict[str, tuple[str, str]] = {
    "vllm:request_max_num_generation_tokens": (
        "Histogram of maximum number of requested generation tokens.", "request_tokens"),
    "vllm:request_params_n": ("Histogram of the n request parameter.",
                              "request_params_n"),
    "vllm:request_time_per_output_token_seconds": (
        "Histogram of time_per_output_token_seconds per request.", "inter_token_latency"),
    "vllm:request_num_preemptions": (
        "Histogram of the number of times a request was preempted.",
        "request_num_preemptions"),
    "vllm:request_prefill_kv_computed_tokens": (
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        "request_tokens"),
}


# vLLM's KV-cache residency histograms (--kv-cache-metrics; vllm/v1/metrics/loggers.py:1041),
# written by the engine core from its sampled blocks (server/engine/kv_metrics.py)
KV_RESIDENCY: dict[str, tuple[str, str]] = {
    "vllm:kv_block_lifetime_seconds": (
        "Histogram of KV cache block lifetime from allocation to eviction. Sampled metrics "
        "(controlled by --kv-cache-metrics-sample).", "kv_cache_residency"),
    "vllm:kv_block_idle_before_evict_seconds": (
        "Histogram of idle time before KV cache block eviction. Sampled metrics (controlled by "
        "--kv-cache-metrics-sample).", "kv_cache_residency"),
    "vllm:kv_block_reuse_gap_seconds": (
        "Histogram of time gaps between consecutive KV cache block accesses. Only the most "
        "recent accesses are recorded (ring buffer). Sampled metrics (controlled by "
        "--kv-cache-metrics-sample).", "kv_cache_residency"),
}


def _vllm_hist(name: str, max_model_len: int, overrides: Overrides | None = None
               ) -> MetricDef:
    doc, family = (HISTOGRAMS.get(name) or HISTOGRAMS_0_33.get(name) or KV_RESIDENCY[name])
    return MetricDef(name, "histogram", doc, family_buckets(family, max_model_len, overrides))


def request_metrics(max_model_len: int, faults: bool = False,
                    buckets: Overrides | None = None, series: str = "vllm") -> list[MetricDef]:
    """What a front end writes per (deployment, rank); `faults`: some deployment of the
    server has failure injection configured (its counters are exported); `buckets`: the
    server's --custom-histogram-buckets; `series`: whose series a pod exports besides the
    vllm: slots the others derive from ("sglang": `server.stats.schema_sglang`, "trtllm":
    `server.stats.schema_trtllm`)."""
    return [
        MetricDef("vllm:prompt_tokens", "counter", "Number of prefill tokens processed."),
        MetricDef("vllm:generation_tokens", "counter", "Number of generation tokens processed."),
        MetricDef("vllm:request_success", "counter", "Count of successfully processed requests.",
                  label="finished_reason", values=FINISH_REASONS),
        MetricDef("vllm:prompt_tokens_by_source", "counter",
                  "Number of prompt tokens by source.", label="source", values=PROMPT_SOURCES),
        MetricDef("vllm:prompt_tokens_cached", "counter",
                  "Number of cached prompt tokens (local + external)."),
        *(_vllm_hist(n, max_model_len, buckets) for n in HISTOGRAMS
          if n != "vllm:iteration_tokens_total"),
        *(_vllm_hist(n, max_model_len, buckets) for n in HISTOGRAMS_0_33),
        MetricDef("doppelchip_inter_token_latency_seconds", "histogram",
                  "Inter-token latency (emulated), sub-millisecond buckets.",
                  FINE_ITL_BUCKETS),
        *(FAULT_REQUEST_METRICS if faults else ()),
        *(SGLANG_REQUEST_METRICS if series == "sglang" else ()),
        *(TRTLLM_REQUEST_METRICS if series == "trtllm" else ()),
    ]


def engine_metrics(info: DeploymentInfo) -> list[MetricDef]:
    """What the engine core of one (deployment, rank) writes; `_`-names are internal. The
    server's --custom-histogram-buckets and --kv-cache-metrics come with `info`."""
    tiers = info.tiers
    buckets = dict(info.histogram_buckets)
    return [
        *(MetricDef(n, "gauge", "internal") for n in (
            "_state", "_epoch", "_pid", "_idle", "_t", "_kv_free", "_kv_used", "_steps",
            "_generated", "_paused", "_ft_status", "_ft_pushes")),
        MetricDef("vllm:num_requests_running", "gauge",
                  "Number of requests in model execution batches."),
        MetricDef("vllm:num_requests_waiting", "gauge",
                  "Number of requests waiting to be processed."),
        MetricDef("vllm:num_requests_waiting_by_reason", "gauge",
                  "Number of waiting requests by reason. Reason labels: 'capacity' = waiting "
                  "for scheduling capacity; 'deferred' = deferred by transient constraints "
                  "(LoRA budget, KV transfer, blocked status). Sum of all reasons equals "
                  "vllm:num_requests_waiting.", label="reason", values=WAITING_REASONS),
        *((MetricDef("vllm:num_requests_kv_fetch_by_stage", "gauge",
                     "Number of waiting requests by async KV load stage. Stage labels: "
                     "'waiting_to_start' = needs an async KV load that has not started; "
                     "'in_progress' = load started and not yet reported finished; "
                     "'completed_waiting' = load finished, request not running yet.",
                     label="stage", values=KV_FETCH_STAGES),) if info.kv_consumer else ()),
        MetricDef("vllm:engine_sleep_state", "gauge",
                  "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means "
                  "engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 "
                  "means sleep level 2.", label="sleep_state", values=SLEEP_STATES),
        MetricDef("vllm:external_prefix_cache_queries", "counter",
                  "External prefix cache queries from KV connector cross-instance cache "
                  "sharing, in terms of number of queried tokens."),
        MetricDef("vllm:external_prefix_cache_hits", "counter",
                  "External prefix cache hits from KV connector cross-instance cache sharing, "
                  "in terms of number of cached tokens."),
        MetricDef("vllm:mm_cache_queries", "counter",
                  "Multi-modal cache queries, in terms of number of queried items."),
        MetricDef("vllm:mm_cache_hits", "counter",
                  "Multi-modal cache hits, in terms of number of cached items."),
        MetricDef("vllm:prompt_tokens_cached_by_source", "counter",
                  "Prefix-cache hit tokens by the cache tier that supplied them: device (local "
                  "HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM "
                  "instance) or external_unspecified. Counted at admission; sums to "
                  "vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
                  label="source", values=CACHE_SOURCES),
        MetricDef("vllm:admission_rejections", "counter",
                  "Number of admission attempts rejected by a queue limit, by reason.",
                  label="reason", values=ADMISSION_REASONS, per_engine=False),
        MetricDef("vllm:estimated_flops_per_gpu", "counter",
                  "Estimated number of floating point operations per GPU (for Model Flops "
                  "Utilization calculations)."),
        MetricDef("vllm:estimated_read_bytes_per_gpu", "counter",
                  "Estimated number of bytes read from memory per GPU (for Model Flops "
                  "Utilization calculations)."),
        MetricDef("vllm:estimated_write_bytes_per_gpu", "counter",
                  "Estimated number of bytes written to memory per GPU (for Model Flops "
                  "Utilization calculations)."),
        *_spec_decode(info.num_speculative_tokens),
        MetricDef("vllm:num_preemptions", "counter",
                  "Cumulative number of preemption from the engine."),
        MetricDef("vllm:prefix_cache_queries", "counter",
                  "Prefix cache queries, in terms of number of queried tokens."),
        MetricDef("vllm:prefix_cache_hits", "counter",
                  "Prefix cache hits, in terms of number of cached tokens."),
        _vllm_hist("vllm:iteration_tokens_total", info.capacity.max_model_len, buckets),
        *(_vllm_hist(n, 0, buckets) for n in (KV_RESIDENCY if info.kv_cache_metrics else ())),
        MetricDef("doppelchip_realtime_lag_seconds", "gauge",
                  "How far the last engine step ended behind its emulated deadline "
                  "(emulated seconds; 0 when idle)."),
        MetricDef("doppelchip_kv_resident_bytes", "gauge",
                  "KV-cache bytes in use per memory tier.", label="tier", values=tiers),
        MetricDef("doppelchip_energy_joules", "counter",
                  "Energy drawn by the deployment's chips (busy, stalled and idle)."),
        MetricDef("doppelchip_cost_dollars", "counter",
                  "The deployment's price for the emulated time so far (USD)."),
        MetricDef("doppelchip_tier_bytes", "counter", "Bytes moved per memory tier (all chips).",
                  label="tier", values=tiers),
        MetricDef("doppelchip_flops", "counter", "FLOPs executed (all chips)."),
        MetricDef("doppelchip_busy_seconds", "counter",
                  "Emulated seconds the device spent executing steps."),
        MetricDef("doppelchip_bound_seconds", "counter",
                  "Emulated busy seconds by what bounded the step "
                  "(memory, compute, overhead, link).", label="bound", values=BOUNDS),
        MetricDef("doppelchip_ssd_page_in_bytes", "counter",
                  "Weight bytes re-read from SSD (llama.cpp mmap page cache misses)."),
        MetricDef("doppelchip_compile_events", "counter",
                  "Compiles (stalls) and cold-start builds, by reason.",
                  label="reason", values=COMPILE_REASONS),
        MetricDef("doppelchip_compile_seconds", "counter",
                  "Emulated seconds spent compiling or building, by reason.",
                  label="reason", values=COMPILE_REASONS),
        MetricDef("doppelchip_pipeline_idle_seconds", "counter",
                  "Emulated seconds the pipeline idled waiting on a compile."),
        MetricDef("doppelchip_jump_forward_tokens", "counter",
                  "Output tokens inserted by jump-forward decoding."),
        MetricDef("doppelchip_step_seconds", "histogram",
                  "Emulated duration of one engine step (compile stall included).",
                  STEP_BUCKETS),
        *pd_sleep_metrics(),
        *(FAULT_ENGINE_METRICS if info.faults else ()),
        *(OFFLOAD_METRICS if info.kv_offload_blocks else ()),
        *(NIXL_METRICS if info.nixl else ()),
    ]


def _spec_decode(k: int) -> list[MetricDef]:
    """vLLM's speculative-decoding counters, registered only with a speculative config."""
    if not k:
        return []
    return [
        MetricDef("vllm:spec_decode_num_drafts", "counter", "Number of spec decoding drafts."),
        MetricDef("vllm:spec_decode_num_draft_tokens", "counter", "Number of draft tokens."),
        MetricDef("vllm:spec_decode_num_accepted_tokens", "counter",
                  "Number of accepted tokens."),
        MetricDef("vllm:spec_decode_num_accepted_tokens_per_pos", "counter",
                  "Accepted tokens per draft position.", label="position",
                  values=tuple(str(i) for i in range(k))),
        MetricDef("_draft_seconds", "gauge", "internal"),  # of the busy time, the draft passes
    ]


# vLLM 0.11.x's deprecated names (the last release offering them, behind
# --show-hidden-metrics-for-version=0.10; vLLM 0.33.0 no longer has them): the production-stack
# router still reads them. name -> (type, help, the current series it mirrors)
HIDDEN_0_10 = {
    "vllm:gpu_cache_usage_perc": (
        "gauge", "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use "
        "vllm:kv_cache_usage_perc instead.", "vllm:kv_cache_usage_perc"),
    "vllm:gpu_prefix_cache_queries": (
        "counter", "GPU prefix cache queries, in terms of number of queriedtokens. DEPRECATED: "
        "Use vllm:prefix_cache_queries instead.", "vllm:prefix_cache_queries"),
    "vllm:gpu_prefix_cache_hits": (
        "counter", "GPU prefix cache hits, in terms of number of cached tokens. DEPRECATED: Use "
        "vllm:prefix_cache_hits instead.", "vllm:prefix_cache_hits"),
}


def compile_reason(stall_reason: str) -> str:
    """A short, bounded label for a compile stall's free-text reason."""
    if stall_reason.startswith("recompile"):
        return "recompile"
    if stall_reason.startswith("compiling new shape"):
        return "new_shape"
    return "other"
