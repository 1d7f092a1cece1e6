"""Prometheus metrics on the metrics port (vLLM names where vLLM has the metric).

A collector reads each engine's status and counters at scrape time, so the hot path pays
nothing. The full vLLM-compatible set (histograms, device metrics) is the observability work.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from server.fleet import Fleet

LABELS = ["model_name", "engine", "deployment"]


class FleetCollector(Collector):
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Number of requests in model execution batches.",
            labels=LABELS,
        )
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
            labels=LABELS,
        )
        kv = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
            labels=LABELS,
        )
        lag = GaugeMetricFamily(
            "doppelchip_realtime_lag_seconds",
            "How far the last engine step ended behind its emulated deadline (emulated s).",
            labels=["deployment"],
        )
        prompt = CounterMetricFamily(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels=LABELS
        )
        generation = CounterMetricFamily(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels=LABELS
        )
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.",
            labels=[*LABELS, "finished_reason"],
        )
        for name, engine in self.fleet.engines.items():
            s = engine.status()
            labels = [s.model, "0", name]  # one engine per deployment: vLLM index "0"
            running.add_metric(labels, s.num_running)
            waiting.add_metric(labels, s.num_waiting)
            cap = s.capacity
            used = cap.kv_blocks_total - cap.kv_blocks_free
            kv.add_metric(labels, used / cap.kv_blocks_total if cap.kv_blocks_total else 0.0)
            lag.add_metric([name], getattr(engine, "lag_s", 0.0))
            prompt.add_metric(labels, engine.stats.prompt_tokens)
            generation.add_metric(labels, engine.stats.generation_tokens)
            for reason, count in sorted(engine.stats.finished.items()):
                success.add_metric([*labels, reason], count)
        yield from (running, waiting, kv, lag, prompt, generation, success)


def start_metrics_server(fleet: Fleet, host: str, port: int) -> WSGIServer:
    """Serve /metrics for this fleet on host:port (port 0: any free port)."""
    registry = CollectorRegistry()
    registry.register(FleetCollector(fleet))
    server = make_server(
        host, port, make_wsgi_app(registry), ThreadingWSGIServer, handler_class=_QuietHandler
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
