"""vLLM 0.34.0's `vllm:request_render_duration_seconds{model_name, request_type}`
(vllm/renderers/metrics.py, observed by `OnlineRenderer.render_chat` and `render_completion`):
the time an API server spends turning a request into the engine's prompt — the chat template,
tokenization, truncation — with vLLM's help text and buckets.

Why it exists: a slow template or a long prompt costs the front end's CPU before the engine
sees the request, and a dashboard tells that apart from queueing with this family. Rendering
is real host work here too (the same templates and tokenizer), so its wall time is measured,
not emulated. As in vLLM, the routes that render through the online renderer observe it:
`chat` — /v1/chat/completions, /v1/messages and its count_tokens,
/v1/chat/completions/render; `completion` — /v1/completions, /v1/completions/render. Not
/tokenize, /v1/responses, /v1/chat/completions/batch, the pooling routes nor
/inference/v1/generate, which vLLM renders without that timing. Only a render that succeeds
is observed; an SGLang or TRT-LLM pod, which has no `vllm:` series, observes nothing. The
family is created at the first render (vLLM registers it lazily), in prometheus_client's
multiprocess files with the HTTP series (server/http/metrics.py), so `/metrics` shows it from
any front end.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram

if TYPE_CHECKING:
    from server.http.state import HttpState

BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
           1, 2.5, 5, 10)  # vLLM's


@functools.lru_cache(maxsize=1)
def _duration() -> Histogram:
    registry = CollectorRegistry(auto_describe=False)  # values go to the multiprocess files
    return Histogram("vllm:request_render_duration_seconds",
                     "Time spent rendering a request, including chat templating, "
                     "tokenization, and multimodal preprocessing.",
                     ["model_name", "request_type"], buckets=BUCKETS, registry=registry)


@contextmanager
def rendering(state: HttpState, model_name: str, request_type: str,
              timed: bool = True) -> Iterator[None]:
    """Observe the block's wall time as one `request_type` ("chat" or "completion") render of
    `model_name`, unless it raises (a refused request is not a render), the front end does
    not speak vLLM's API, or the route is not `timed` (vLLM renders it unobserved)."""
    start = time.perf_counter()
    yield
    if timed and state.vllm_api:
        _duration().labels(model_name, request_type).observe(time.perf_counter() - start)
