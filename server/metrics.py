"""`/metrics`: one consistent view of the whole server, rendered by whichever front end a scrape
reaches — the stats arrays of every engine and front-end process (`server.stats.collector`)
plus every front end's HTTP series (prometheus-fastapi-instrumentator's, kept by
prometheus_client's multiprocess mode in the run directory). See docs/OBSERVABILITY.md for
every metric and the dashboards built on them.

Always the Prometheus text format 0.0.4, whatever the scraper's Accept header: prometheus_client's
OpenMetrics writer (chosen when Prometheus asks for it, as it does by default) rewrites ':' in
sample names to '_' (0.26: sample names are escaped with the label-name character set), so
`vllm:prompt_tokens_total` would reach Prometheus as `vllm_prompt_tokens_total` and vLLM
dashboards would find nothing. The text format keeps vLLM's names intact.
"""

from __future__ import annotations

import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.multiprocess import MultiProcessCollector

from server.stats.collector import StatsCollector

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


class MetricsView:
    """Renders the server's exposition: the stats collector's series (its own compiled
    renderer, `server.stats.exposition`), then the HTTP series of every front end (the
    multiprocess directory, through prometheus_client). Thread-safe: one render at a time."""

    def __init__(self, collector: StatsCollector, multiprocess_dir: Path | None) -> None:
        self.collector = collector
        self.registry = CollectorRegistry(auto_describe=False)
        if multiprocess_dir is not None:
            MultiProcessCollector(self.registry, path=str(multiprocess_dir))
        self._lock = threading.Lock()

    def render(self) -> bytes:
        with self._lock:
            return self.collector.render().encode() + generate_latest(self.registry)

    def iteration_stats(self) -> list[dict]:
        """A TensorRT-LLM pod's `/metrics` JSON (it reads the same held values as a render)."""
        with self._lock:
            return self.collector.iteration_stats()
