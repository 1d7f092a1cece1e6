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
  cache hit rate, utilization; `memory`, `speculative` (a speculating pod's, once it
  verified) and `queues` sections) — what smg's load monitor polls.
- `GET|POST /flush_cache`: empties the prefix cache ("Cache flushed." 200), or 400 while
  requests run, as SGLang refuses then.
- `POST /abort_request` `{"rid"}` or `{"abort_all": true}`: aborts by request id, 200.
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.engine.interface import DeploymentState
from server.frontend.sglang_pod import (
    SGLANG_VERSION,
    Windows,
    load_snapshot,
    model_info,
    probe,
    server_info,
    unknown_sections,
)
from server.http.pod_app import pod_client
from server.http.rl import abort_matching
from server.http.routes import healthy
from server.http.state import HttpState


async def health_generate(state: HttpState) -> Response:
    """SGLang's check (`sglang_pod.probe`): 503 while starting or draining, or when the
    one-token generation fails; 200 once it produced its token."""
    if not healthy(state):
        return Response(status_code=503)
    return Response(status_code=200 if await probe(pod_client(state)) else 503)


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
        return model_info(pod_client(state))

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info_() -> dict:
        return server_info(pod_client(state), state.enable_metrics)

    @app.get("/v1/loads")
    async def loads(dp_rank: int | None = None, include: str | None = None,
                    format: str | None = None) -> Response:
        sections = {s.strip() for s in include.split(",")} if include else None
        if sections is not None and (refusal := unknown_sections(sections)):
            return JSONResponse({"detail": refusal}, 400)
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
