"""The metrics port: `/metrics` in the Prometheus text format, rendered from the stats arrays
of every process of the server (`server.stats.collector`). See docs/OBSERVABILITY.md for every
metric and the dashboards built on them."""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, ThreadingWSGIServer
from prometheus_client.registry import Collector


def make_registry(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
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


def start_metrics_server(registry: CollectorRegistry, host: str, port: int) -> WSGIServer:
    """Serve /metrics on host:port (port 0: any free port) from a thread."""
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
