"""The HTTP application of a TensorRT-LLM pod (`--http-api trtllm`): trtllm-serve's OpenAI
server (TensorRT-LLM 1.3, `tensorrt_llm/serve/openai_server.py`) as routers, dashboards and
tools that know trtllm-serve use it: llm-d's endpoint picker (engine type `trtllm-serve`)
scrapes `/prometheus/metrics` for `trtllm_num_requests_waiting`, `trtllm_kv_cache_utilization`
and the KV block gauges; TensorRT-LLM's benchmarks poll `/metrics`; clients use the OpenAI
routes.

Routes: the native ones (`server.http.trtllm.native`), `/v1/completions` and
`/v1/chat/completions` (the same handlers as a vLLM pod's; `model` is not checked and the
answer names the served model, as trtllm-serve answers with its own name), and, with
`--enable-metrics` (TensorRT-LLM's `return_perf_metrics`), `/prometheus/metrics`: the trtllm_
series (`server.stats.collector_trtllm`) and doppelchip's device series. Not here: vLLM's own
routes (`/tokenize`, `/load`, `/ping`, ...), the Responses API, TensorRT-LLM's RL and
disaggregation routes.

Errors: the OpenAI routes answer TensorRT-LLM's flat `ErrorResponse` (`{"object": "error",
"message", "type", "param", "code"}`), a refused body 400; an unknown route 404 `{"detail":
"Not Found"}` (FastAPI's). `--api-key` (trtllm-serve has none): as on a vLLM pod, with
`/prometheus/metrics` open like `/metrics`.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server import metrics as exposition
from server.auth import ApiKeys
from server.http.app import PUBLIC_PATHS, ApiKeyMiddleware
from server.http.errors import HttpError
from server.http.flat_errors import OpenAIErrors, flat
from server.http.pod_app import add_error_handlers, add_openai_generation
from server.http.state import HttpState
from server.http.trtllm.native import add_native_routes, served_name

METRICS_PATHS = ("/prometheus/metrics", "/prometheus/metrics/")


def answer(request: Request, e: HttpError) -> Response:
    return JSONResponse(flat(e.body()), e.status)


def build_trtllm_app(state: HttpState, keys: ApiKeys | None = None) -> FastAPI:
    app = FastAPI()
    app.state.http = state
    add_error_handlers(app, answer)
    add_native_routes(app, state)
    add_openai_generation(app, state, (served_name(state),))  # trtllm-serve answers any model

    if state.enable_metrics:  # trtllm-serve mounts it with return_perf_metrics only
        async def prometheus_metrics() -> Response:
            body = await asyncio.to_thread(state.metrics.render)
            return Response(body, media_type=exposition.CONTENT_TYPE)

        for path in METRICS_PATHS:
            app.add_api_route(path, prometheus_metrics, methods=["GET"])

    app.add_middleware(OpenAIErrors)
    if keys:
        app.add_middleware(ApiKeyMiddleware, keys=keys, routes=lambda: app.router.routes,
                           public=(*PUBLIC_PATHS, "/prometheus"))
    return app
