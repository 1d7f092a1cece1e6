"""Prometheus metrics on the metrics port: vLLM's v1 set plus doppelchip's device metrics.

Each `App` has its own `CollectorRegistry` (several servers run in one test process). Two kinds
of metric live in it:
- scrape time (`FleetCollector`): gauges and counters read from each engine's status and
  cumulative counters (`engine.stats`, `core.scheduler.stats`, `core.stats`, the placement), so
  the hot path pays nothing for them;
- events (`server.metrics_vllm`, `server.metrics_device`): histograms and per-step device
  counters, fed through the engine's observer hooks (`server.engine.events`).
See docs/OBSERVABILITY.md for every metric and the dashboards built on them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, ThreadingWSGIServer
from prometheus_client.registry import Collector

from server.engine.events import EngineObserver, FinishedEvent, StepEvent, TokensEvent
from server.engine.interface import FinishReason
from server.fleet import Fleet
from server.metrics_device import DeviceEvents, peak_flops, tier_peaks
from server.metrics_vllm import ENGINE_INDEX, LABELS, VllmHistograms

DEV = ["deployment", "chip"]


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


class FleetCollector(Collector):
    """The scrape-time metrics of every deployment of a fleet."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        v = list(LABELS)
        running = _gauge("vllm:num_requests_running",
                         "Number of requests in model execution batches.", v)
        waiting = _gauge("vllm:num_requests_waiting",
                         "Number of requests waiting to be processed.", v)
        kv = _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", v)
        info_labels = ["engine", "deployment", "model_name", "block_size", "num_gpu_blocks",
                       "enable_prefix_caching", "gpu_memory_utilization", "cache_dtype"]
        info = _gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                      info_labels)
        prompt = _counter("vllm:prompt_tokens", "Number of prefill tokens processed.", v)
        generation = _counter("vllm:generation_tokens",
                              "Number of generation tokens processed.", v)
        success = _counter("vllm:request_success", "Count of successfully processed requests.",
                           [*v, "finished_reason"])
        preempt = _counter("vllm:num_preemptions",
                           "Cumulative number of preemption from the engine.", v)
        queries = _counter("vllm:prefix_cache_queries",
                           "Prefix cache queries, in terms of number of queried tokens.", v)
        hits = _counter("vllm:prefix_cache_hits",
                        "Prefix cache hits, in terms of number of cached tokens.", v)
        lag = _gauge("doppelchip_realtime_lag_seconds",
                     "How far the last engine step ended behind its emulated deadline "
                     "(emulated seconds).", DEV)
        chips = _gauge("doppelchip_chips", "Chips the deployment is placed on.", DEV)
        weights = _gauge("doppelchip_weights_resident_bytes",
                         "Weight bytes resident per memory tier.", [*DEV, "tier"])
        kv_res = _gauge("doppelchip_kv_resident_bytes",
                        "KV-cache bytes in use per memory tier.", [*DEV, "tier"])
        peak_bw = _gauge("doppelchip_tier_peak_bandwidth_bytes_per_second",
                         "Peak bandwidth of a memory tier, all chips of the deployment.",
                         [*DEV, "tier"])
        peak_fl = _gauge("doppelchip_peak_flops_per_second",
                         "Dense peak FLOP/s of the deployment's chips on its compute path.", DEV)
        joules = _counter("doppelchip_energy_joules",
                          "Energy drawn by the deployment's chips (busy, stalled and idle).", DEV)
        dollars = _counter("doppelchip_cost_dollars",
                           "The deployment's price for the emulated time so far (USD).", DEV)
        for name, engine in self.fleet.engines.items():
            s = engine.status()
            labels = [s.model, ENGINE_INDEX, name]
            running.add_metric(labels, s.num_running)
            waiting.add_metric(labels, s.num_waiting)
            cap = s.capacity
            used = cap.kv_blocks_total - cap.kv_blocks_free
            kv.add_metric(labels, used / cap.kv_blocks_total if cap.kv_blocks_total else 0.0)
            prompt.add_metric(labels, engine.stats.prompt_tokens)
            generation.add_metric(labels, engine.stats.generation_tokens)
            finished = dict(engine.stats.finished)
            for reason in FinishReason:  # every reason from the start, at 0, as vLLM does
                success.add_metric([*labels, reason.value], finished.get(reason.value, 0))
            core = getattr(engine, "core", None)
            if core is None:  # not placed: nothing on a device to describe
                continue
            sched, p = core.scheduler, core.placement
            dev = [name, s.chip]
            cfg = sched.config
            info.add_metric([ENGINE_INDEX, name, s.model, str(cfg.block_size),
                             str(cfg.num_blocks), str(cfg.enable_prefix_caching),
                             str(p.spec.gpu_mem_utilisation), "auto"], 1.0)
            preempt.add_metric(labels, sched.stats.num_preemptions)
            queries.add_metric(labels, sched.stats.prefix_cache_queries)
            hits.add_metric(labels, sched.stats.prefix_cache_hits)
            lag.add_metric(dev, getattr(engine, "lag_s", 0.0))
            chips.add_metric(dev, p.chips)
            resident = dict(p.weight_bytes)
            for tier, b in sorted(resident.items()):
                weights.add_metric([*dev, tier], b)
            for tier, b in sorted(p.memory_bytes(used * cap.block_size).items()):
                kv_res.add_metric([*dev, tier], max(0.0, b - resident.get(tier, 0.0)))
            for tier, bw in sorted(tier_peaks(p).items()):
                peak_bw.add_metric([*dev, tier], bw)
            peak_fl.add_metric(dev, peak_flops(p))
            spent_j, spent_usd = engine.energy_and_cost()
            joules.add_metric(dev, spent_j)
            dollars.add_metric(dev, spent_usd)
        yield from (running, waiting, kv, info, prompt, generation, success, preempt, queries,
                    hits, lag, chips, weights, kv_res, peak_bw, peak_fl, joules, dollars)


class _Fanout:
    """One engine's observer: every metric family that listens to its events."""

    def __init__(self, *observers: EngineObserver) -> None:
        self.observers = observers

    def on_startup(self, seconds: float, cold: bool) -> None:
        for o in self.observers:
            o.on_startup(seconds, cold)

    def on_step(self, event: StepEvent) -> None:
        for o in self.observers:
            o.on_step(event)

    def on_tokens(self, event: TokensEvent) -> None:
        for o in self.observers:
            o.on_tokens(event)

    def on_request_finished(self, event: FinishedEvent) -> None:
        for o in self.observers:
            o.on_request_finished(event)


def make_registry(fleet: Fleet) -> CollectorRegistry:
    """A registry with every metric of `fleet`; attaches the observers to its engines."""
    registry = CollectorRegistry()
    registry.register(FleetCollector(fleet))
    placed = {n: e for n, e in fleet.engines.items() if getattr(e, "core", None) is not None}
    max_len = max((e.core.scheduler.config.max_model_len for e in placed.values()), default=1)
    vllm = VllmHistograms(registry, max_len)
    device = DeviceEvents(registry)
    for name, engine in placed.items():
        s = engine.status()
        engine.observer = _Fanout(vllm.observer(s.model, name), device.observer(name, s.chip))
    return registry


def text_format_app(registry: CollectorRegistry) -> WSGIApplication:
    """/metrics in the Prometheus text format 0.0.4, whatever the scraper's Accept header.

    prometheus_client's OpenMetrics writer (chosen when Prometheus asks for it, as it does by
    default) rewrites ':' in sample names to '_' (0.26: sample names are escaped with the
    label-name character set), so `vllm:prompt_tokens_total` would reach Prometheus as
    `vllm_prompt_tokens_total` and vLLM dashboards would find nothing. The text format keeps
    vLLM's names intact."""

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: try /metrics\n"]
        body = generate_latest(registry)
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4),
                                  ("Content-Length", str(len(body)))])
        return [body]

    return app


def start_metrics_server(fleet: Fleet, host: str, port: int) -> WSGIServer:
    """Serve /metrics for this fleet on host:port (port 0: any free port)."""
    registry = make_registry(fleet)
    server = make_server(
        host, port, text_format_app(registry), ThreadingWSGIServer, handler_class=_QuietHandler
    )
    # A short poll interval so that shutdown() returns promptly when the server drains.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
        name="metrics-http",
    )
    thread.start()
    return server


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # scrapes are not news
        pass
