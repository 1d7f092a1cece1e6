"""The field's HTTP metrics, as vLLM 0.33.0 configures them
(`vllm/entrypoints/serve/instrumentator/metrics.py`): prometheus-fastapi-instrumentator's
default set — `http_requests_total{handler,method,status}`, `http_request_size_bytes`,
`http_response_size_bytes`, `http_request_duration_highr_seconds`,
`http_request_duration_seconds{handler,method}` — with its default buckets, status codes
grouped (`2xx`…), the route template as `handler`, streaming included in the duration, and
`/metrics`, `/health`, `/load`, `/ping`, `/version`, `/server_info` not instrumented.

Several front ends share the port, as vLLM's API servers do with `--api-server-count`, so the
series live in prometheus_client's multiprocess mode: every front end writes its values to
files in one directory of the server's run directory, and every `/metrics` (whichever front end
answers) reads all of them — one consistent view (counters and histograms summed over the
front ends; a restarted front end's files stay, so its counts are not lost).
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry, values
from prometheus_fastapi_instrumentator import Instrumentator
from starlette.applications import Starlette

EXCLUDED = ["/metrics", "/health", "/load", "/ping", "/version", "/server_info"]


def enable_multiprocess(directory: Path) -> None:
    """Make this process's prometheus_client metrics multiprocess-backed, in `directory`
    (before any metric is created; the forkserver may have imported prometheus_client
    already, so the value class is switched explicitly)."""
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    values.ValueClass = values.get_value_class()


def instrument(app: Starlette) -> None:
    """Add the HTTP metrics middleware (its metrics are created at the app's first request).
    The registry is a private holder: values go to the multiprocess files, and `/metrics`
    reads them from there."""
    Instrumentator(excluded_handlers=EXCLUDED,
                   registry=CollectorRegistry(auto_describe=False)).add().instrument(app)
