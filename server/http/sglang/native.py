"""SGLang 0.5.23's native routes besides `/generate` (`sglang/srt/entrypoints/http_server.py`,
`v1_loads.py`), answered from the pod's one deployment:

- `GET /health` and `/health_generate`: 503 while starting or draining; otherwise a one-token
  generation from token 0 runs, as SGLang's check does, and 200 once it produced its token
  (503 if it failed). `GET /ready`: 200 once serving, no generation.
- `GET /model_info` (and the deprecated `/get_model_info`): the model's path, served name,
  whether it generates, its architecture.
- `GET /server_info` (and `/get_server_info`): the resolved server arguments doppelchip
  emulates, the scheduler's capacity, `internal_states` per data-parallel rank, `version`.
- `GET /v1/loads` (`?include=`, `?dp_rank=`, `?format=prometheus`): each rank's
  `LoadSnapshot` (running and waiting requests, tokens used of the pool, usage, throughput,
  cache hit rate, utilization; `memory` and `queues` sections) — what smg's load monitor polls.
- `GET|POST /flush_cache`: empties the prefix cache ("Cache flushed." 200), or 400 while
  requests run, as SGLang refuses then.
- `POST /abort_request` `{"rid"}` or `{"abort_all": true}`: aborts by request id, 200.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.engine.interface import (
    DeploymentState,
    EngineError,
    EngineRequest,
    FinishReason,
    PoolingParams,
    SamplingParams,
)
from server.frontend import parallel
from server.frontend.deployment import DeploymentClient
from server.frontend.stream import StreamFailed
from server.http.rl import abort_matching
from server.http.routes import healthy
from server.http.state import HttpState
from server.stats.collector_sglang import HitRate, Throughput

SGLANG_VERSION = "0.5.23"  # the SGLang release whose server this mirrors (docs/SGLANG.md)
SECTIONS = ("core", "memory", "spec", "lora", "disagg", "queues", "all")


def pod_client(state: HttpState) -> DeploymentClient:
    return next(iter(state.fleet.clients.values()))


class Windows:
    """Each rank's `/v1/loads` windows between two polls (as the sglang: gauges' between two
    scrapes): generated tokens per emulated second, prefix-cache hit rate."""

    def __init__(self) -> None:
        self.rates: dict[int, tuple[Throughput, HitRate]] = {}

    def of(self, rank: int) -> tuple[Throughput, HitRate]:
        return self.rates.setdefault(rank, (Throughput(), HitRate()))


def load_snapshot(client: DeploymentClient, rank: int, windows: Windows, now: float,
                  include: set[str] | None) -> dict:
    """One rank's `LoadSnapshot.to_dict(include)`."""
    rate, hit_rate = windows.of(rank)
    view = client.views[rank]
    values, _ = view.read()
    status = client.status([rank])
    c = status.capacity
    used = (c.kv_blocks_total - c.kv_blocks_free) * c.block_size
    total = c.kv_blocks_total * c.block_size
    queries = view.value(values, "vllm:prefix_cache_queries")
    hits = view.value(values, "vllm:prefix_cache_hits")
    cap = c.max_num_seqs  # SGLang's max_running_requests
    out: dict = {
        "timestamp": time.time(), "dp_rank": view.info.dp_rank,
        "num_running_reqs": status.num_running, "num_waiting_reqs": status.num_waiting,
        "num_waiting_uncached_tokens": 0, "num_used_tokens": used, "num_total_tokens": used,
        "num_active_tokens": used, "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": total, "max_running_requests": cap,
        "token_usage": used / total if total else 0.0,
        "gen_throughput": rate(client.generated_tokens([rank]), now),
        "cache_hit_rate": hit_rate(hits, queries),
        "utilization": status.num_running / cap if cap else 0.0,
        "total_prefill_uncached_tokens": int(queries - hits), "total_prefill_busy_us": 0,
        "decode_moments": None,
    }
    if include is None or "all" in include or "memory" in include:
        info = view.info
        out["memory"] = {"weight_gb": round(sum(info.weights_resident) / 1e9, 3),
                         "kv_cache_gb": round(total * info.kv_bytes_per_token / 1e9, 3),
                         "graph_gb": 0.0, "token_capacity": total}
    if include is None or "all" in include or "queues" in include:
        out["queues"] = {"waiting": status.num_waiting, "grammar": 0, "paused": 0,
                         "retracted": 0, "prealloc_ready": 0}
    return out


def server_info(state: HttpState) -> dict:
    client = pod_client(state)
    info, c = client.info, client.info.capacity
    lim = client.limits
    return {
        "model_path": info.model_path or info.model, "tokenizer_path": info.model_path or
        info.model, "served_model_name": info.model_name, "tp_size": info.tensor_parallel,
        "pp_size": info.pipeline_parallel, "dp_size": info.data_parallel_size,
        "context_length": c.max_model_len, "mem_fraction_static": info.gpu_memory_utilisation,
        "max_running_requests": c.max_num_seqs, "page_size": c.block_size,
        "disable_radix_cache": not info.enable_prefix_caching,
        "kv_cache_dtype": info.cache_dtype, "schedule_policy": "fcfs" if not
        lim.priority_scheduling else "priority", "enable_metrics": state.enable_metrics,
        "device": "cuda", "chip": info.chip, "max_total_num_tokens": c.kv_blocks_total *
        c.block_size, "max_req_input_len": c.max_model_len - 1, "status": "ready",
        "internal_states": [{"world_size": info.tensor_parallel * info.pipeline_parallel,
                             "effective_max_running_requests_per_dp": c.max_num_seqs,
                             "last_gen_throughput": 0.0}
                            for _ in client.views],
        "version": SGLANG_VERSION, "frontend": "python",
    }


def model_info(state: HttpState) -> dict:
    client = pod_client(state)
    info = client.info
    generation = not client.limits.pooling_task
    return {"model_path": info.model_path or info.model, "served_model_name": info.model_name,
            "tokenizer_path": info.model_path or info.model, "is_generation": generation,
            "preferred_sampling_params": None, "weight_version": "default",
            "load_format": "auto", "reasoning_parser": None, "tool_call_parser": None,
            "disaggregation_mode": "null", "has_image_understanding": False,
            "has_audio_understanding": False, "model_type": None, "architectures": None}


async def health_generate(state: HttpState) -> Response:
    """SGLang's check: one token from input_ids [0] (not counted in the metrics there; here
    it counts as any request does)."""
    if not healthy(state):
        return Response(status_code=503)
    client = pod_client(state)
    pooled = bool(client.limits.pooling_task)  # SGLang sends an EmbeddingReqInput then
    request = EngineRequest(f"HEALTH_CHECK_{time.monotonic_ns()}", prompt_token_ids=(0,),
                            sampling=SamplingParams(max_tokens=1, temperature=0.0),
                            pooling=PoolingParams(task=client.limits.pooling_task) if pooled
                            else None)
    try:
        (stream,) = await parallel.submit_all(client, [request])
    except EngineError:  # refused (a full queue, a drain): SGLang's check times out: 503
        return Response(status_code=503)
    try:
        async for chunk in stream.outputs():
            if chunk.token_ids or (pooled and chunk.finish is not None
                                   and chunk.finish.reason is FinishReason.STOP):
                return Response(status_code=200)
    except StreamFailed:
        pass
    finally:
        client.abort(stream)  # (a no-op once finished)
    return Response(status_code=503)


def add_native_routes(app: FastAPI, state: HttpState) -> None:
    windows = Windows()

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return await health_generate(state)

    @app.get("/ready")
    async def ready() -> Response:
        ok = pod_client(state).status().state is DeploymentState.READY and not state.draining
        return Response(status_code=200 if ok else 503)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info_() -> dict:
        return model_info(state)

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info_() -> dict:
        return server_info(state)

    @app.get("/v1/loads")
    async def loads(dp_rank: int | None = None, include: str | None = None,
                    format: str | None = None) -> Response:
        sections = {s.strip() for s in include.split(",")} if include else None
        if sections is not None and not sections <= set(SECTIONS):
            return JSONResponse({"detail": f"Invalid include sections: "
                                 f"{sections - set(SECTIONS)}. Valid options: "
                                 f"{sorted(SECTIONS)}"}, 400)
        client = pod_client(state)
        now = state.now()
        out = [load_snapshot(client, r, windows, now, sections)
               for r, view in enumerate(client.views)
               if dp_rank is None or view.info.dp_rank == dp_rank]
        if format == "prometheus":
            return Response(prometheus_loads(out), media_type="text/plain; version=0.0.4; "
                            "charset=utf-8")
        info = client.info
        return JSONResponse({"timestamp": datetime.now(UTC).isoformat(),
                             "version": SGLANG_VERSION, "accelerator": info.chip,
                             "num_accelerators": info.tensor_parallel * info.pipeline_parallel,
                             "loads": out})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        if await pod_client(state).reset_prefix_cache():
            return Response("Cache flushed.\nPlease check backend logs for more details. "
                            "(When there are running or waiting requests, the operation will "
                            "not be performed.)\n", 200)
        return Response("Flush cache failed.\n", 400)

    @app.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        if body.get("abort_all"):
            abort_matching(state, None)
        elif body.get("rid") is not None:
            abort_matching(state, [str(body["rid"])])
        return Response(status_code=200)


def prometheus_loads(loads: list[dict]) -> str:
    """`/v1/loads?format=prometheus`: `sglang_<key>{dp_rank="N"}` gauges, sections flattened
    as `sglang_<section>_<key>` (SGLang's `_format_loads_prometheus`)."""
    prefixes = {"speculative": "spec", "disaggregation": "disagg"}
    samples: dict[str, list[tuple[int, float]]] = {}
    for load in loads:
        load = dict(load)
        rank = load.pop("dp_rank")
        for key, value in load.items():
            if isinstance(value, dict):
                for sub, v in value.items():
                    if isinstance(v, int | float):
                        samples.setdefault(f"sglang_{prefixes.get(key, key)}_{sub}",
                                           []).append((rank, v))
            elif isinstance(value, int | float):
                samples.setdefault(f"sglang_{key}", []).append((rank, value))
    lines = []
    for name, values in samples.items():
        lines.append(f"# TYPE {name} gauge")
        lines += [f'{name}{{dp_rank="{rank}"}} {v}' for rank, v in values]
    return "\n".join(lines) + "\n"
