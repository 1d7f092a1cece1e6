"""trtllm-serve's own routes besides the OpenAI ones (TensorRT-LLM 1.3,
`tensorrt_llm/serve/openai_server.py` `register_routes`), answered from the pod's deployment:

- `GET /health`: 200 with an empty body once the deployment serves; 503 "LLM is unavailable.
  Please check the server logs for more details." while it starts or drains.
- `GET /health_generate`: a one-token generation (TensorRT-LLM sends a one-token chat "hi");
  200 "Generation health check OK", else 500 "Generation health check failed".
- `GET /version`: `{"version": ...}`, the release TensorRT-LLM's gRPC `GetServerInfo` names.
- `GET /v1/models`: one `ModelCard`, `owned_by` "tensorrt_llm".
- `GET /metrics`: the iteration stats (a JSON list) drained since the previous call, with
  `--enable-metrics` (TensorRT-LLM's `enable_iter_perf_stats`); `[]` without it
  (`server.stats.collector_trtllm.IterationLog`).
- `GET /perf_metrics`: `[]` (`perf_metrics_max_requests` is 0 by default, which keeps none).
- `POST /kv_cache_events`: the KV cache events since the previous call, in TensorRT-LLM's JSON
  (`server.http.trtllm.kv_cache_events`); `[]` without KV events.
- `GET /server_info`: what TensorRT-LLM's routers read before routing there:
  `disaggregated_params` (null: no disaggregated role), `max_batch_size`, `kv_cache_hash_algo`
  ("v1_block_key") and `tokens_per_block` (the pod's block size).
"""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI
from starlette.responses import JSONResponse, Response

from server.frontend.sglang_pod import probe
from server.http.pod_app import pod_client
from server.http.routes import healthy
from server.http.state import HttpState
from server.http.trtllm.kv_cache_events import KvCacheEvents
from server.kv_events.trtllm_hash import HASH_ALGO
from server.trtllm_servicer import TRTLLM_VERSION

UNAVAILABLE = "LLM is unavailable. Please check the server logs for more details."


def served_name(state: HttpState) -> str:
    """trtllm-serve's `self.model`: the one name it answers with, whatever a request says."""
    return pod_client(state).info.model_name


def model_card(state: HttpState) -> dict:
    return {"id": served_name(state), "object": "model", "created": int(time.time()),
            "owned_by": "tensorrt_llm"}


def add_native_routes(app: FastAPI, state: HttpState) -> None:
    @app.get("/health")
    async def health() -> Response:
        if healthy(state):
            return Response(status_code=200)
        return Response(UNAVAILABLE, status_code=503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        if healthy(state) and await probe(pod_client(state)):
            return Response("Generation health check OK", status_code=200)
        return Response("Generation health check failed", status_code=500)

    @app.get("/version")
    async def version() -> dict:
        return {"version": TRTLLM_VERSION}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card(state)]}

    @app.get("/metrics")
    async def iteration_stats() -> Response:
        if not state.enable_metrics:
            return JSONResponse([])
        return JSONResponse(await asyncio.to_thread(state.metrics.iteration_stats))

    @app.get("/perf_metrics")
    async def perf_metrics() -> Response:
        return JSONResponse([])

    events: list[KvCacheEvents] = []  # made at the first call (the deployment is up by then)

    @app.post("/kv_cache_events")
    async def kv_cache_events() -> Response:
        if not events:
            events.append(KvCacheEvents(pod_client(state)))
        return JSONResponse(await events[0].drain())

    @app.get("/server_info")
    async def server_info() -> dict:
        info = pod_client(state).info
        return {"disaggregated_params": None, "max_batch_size": info.capacity.max_num_seqs,
                "kv_cache_hash_algo": HASH_ALGO, "tokens_per_block": info.capacity.block_size}
