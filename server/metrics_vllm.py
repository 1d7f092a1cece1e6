"""vLLM's v1 Prometheus metrics: the same names, types, label names and histogram buckets.

Sources (vLLM, github.com/vllm-project/vllm), transcribed into
`tests/observability/vllm_reference.json`, which `test_obs_vllm_spec.py` holds this module to:
- names, types, help strings, label names and which bucket list each histogram uses:
  `vllm/v1/metrics/loggers.py` at 005a810bc40faa25b8870fbc8559c3462581eee3
  (`PrometheusStatLogger.__init__`); at that commit the inter-token histogram is still called
  `vllm:time_per_output_token_seconds`; its successor `vllm:inter_token_latency_seconds` (same
  buckets) is named in `docs/design/metrics.md` at 0328b592a3d35f9b4dc5549d2a3fb8d1531c8e5f;
- bucket boundaries: `vllm/v1/metrics/buckets.py` at 139b1c3f17720f4bb6865309f365e6b1f1607a45
  (REQUEST_LATENCY_BUCKETS, TIME_TO_FIRST_TOKEN_BUCKETS, INTER_TOKEN_LATENCY_BUCKETS,
  ITERATION_TOKENS_BUCKETS, `build_1_2_5_buckets(max_model_len)` for token counts);
- interval definitions: `docs/design/metrics.md` at 0328b592…, "Interval Calculations":
  queue = QUEUED → SCHEDULED, prefill = SCHEDULED → first NEW_TOKENS, decode = first → last
  NEW_TOKENS, inference = SCHEDULED → last NEW_TOKENS, inter-token = between successive
  NEW_TOKENS, TTFT from arrival, e2e from arrival to the final token; a preemption counts in
  the prefill and TTFT intervals (preempted in prefill) or in decode, inference and
  inter-token (preempted in decode), so the SCHEDULED that ends the queue is the first one.

Labels are vLLM's `model_name` and `engine` (the engine index: one engine per deployment, "0")
plus our `deployment`. One registry holds every deployment, so the token-count histograms use
the 1-2-5 series up to the largest `max_model_len` in the fleet (vLLM has one model a process).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from server.engine.events import FinishedEvent, StepEvent, TokensEvent

LABELS = ("model_name", "engine", "deployment")
ENGINE_INDEX = "0"

REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's 1-2-5 series up to `max_value`: build_1_2_5_buckets(100) = [1, 2, 5, ..., 100]."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


# name -> (help, buckets: a tuple, or "1-2-5" for build_1_2_5_buckets(max_model_len))
HISTOGRAMS: dict[str, tuple[str, tuple[float, ...] | str]] = {
    "vllm:request_prompt_tokens": ("Number of prefill tokens processed.", "1-2-5"),
    "vllm:request_generation_tokens": ("Number of generation tokens processed.", "1-2-5"),
    "vllm:iteration_tokens_total": ("Histogram of number of tokens per engine_step.",
                                    ITERATION_TOKENS_BUCKETS),
    "vllm:request_params_max_tokens": ("Histogram of the max_tokens request parameter.",
                                       "1-2-5"),
    "vllm:time_to_first_token_seconds": ("Histogram of time to first token in seconds.",
                                         TIME_TO_FIRST_TOKEN_BUCKETS),
    "vllm:inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.",
                                         INTER_TOKEN_LATENCY_BUCKETS),
    "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.",
                                         REQUEST_LATENCY_BUCKETS),
    "vllm:request_queue_time_seconds": ("Histogram of time spent in WAITING phase for request.",
                                        REQUEST_LATENCY_BUCKETS),
    "vllm:request_inference_time_seconds": (
        "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS),
    "vllm:request_prefill_time_seconds": (
        "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS),
    "vllm:request_decode_time_seconds": (
        "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS),
}


class VllmHistograms:
    """The per-request and per-step histograms, shared by every deployment of one App."""

    def __init__(self, registry: CollectorRegistry, max_model_len: int) -> None:
        self.h: dict[str, Histogram] = {}
        for name, (doc, buckets) in HISTOGRAMS.items():
            b = build_1_2_5_buckets(max_model_len) if buckets == "1-2-5" else buckets
            self.h[name] = Histogram(name, doc, LABELS, buckets=b, registry=registry)

    def observer(self, model_name: str, deployment: str) -> VllmObserver:
        return VllmObserver(self, (model_name, ENGINE_INDEX, deployment))


class VllmObserver:
    """One deployment's view of the histograms (label values bound once)."""

    def __init__(self, hists: VllmHistograms, labels: tuple[str, str, str]) -> None:
        self.m = {name: h.labels(*labels) for name, h in hists.h.items()}

    def on_startup(self, seconds: float, cold: bool) -> None:
        pass

    def on_step(self, event: StepEvent) -> None:
        self.m["vllm:iteration_tokens_total"].observe(event.result.output.num_batched_tokens)

    def on_tokens(self, event: TokensEvent) -> None:
        ttft = event.ttft
        if ttft is not None:
            self.m["vllm:time_to_first_token_seconds"].observe(ttft)
        itl = self.m["vllm:inter_token_latency_seconds"]
        for interval in event.inter_token_latencies():
            itl.observe(interval)

    def on_request_finished(self, event: FinishedEvent) -> None:
        t, u, m = event.finish.timings, event.finish.usage, self.m
        m["vllm:e2e_request_latency_seconds"].observe(t.e2e_s)
        m["vllm:request_queue_time_seconds"].observe(t.queue_s)
        m["vllm:request_prefill_time_seconds"].observe(t.prefill_s)
        m["vllm:request_decode_time_seconds"].observe(t.decode_s)
        m["vllm:request_inference_time_seconds"].observe(t.prefill_s + t.decode_s)
        m["vllm:request_prompt_tokens"].observe(u.prompt_tokens)
        m["vllm:request_generation_tokens"].observe(u.completion_tokens)
        if event.max_tokens:
            m["vllm:request_params_max_tokens"].observe(event.max_tokens)
