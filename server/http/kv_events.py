"""KV-event routes of a vLLM pod (0.33.0): `POST /reset_prefix_cache` (vLLM registers it in
dev mode only; always here) answers `{"success": bool}`, false while requests hold blocks
(`?reset_running_requests=true` preempts the running ones first, as vLLM's;
`?reset_external=true` empties the CPU offloading tier too, as vLLM's reset_connector);
`GET /kv_event_sources` the resolved publisher config per data-parallel rank (the bound
endpoints, port 0 resolved), `{}` when the deployment publishes nothing. Both act on the
deployment `?model=` names, else the default one (a pod's only one)."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse

from server.engine.kv_events_config import KVEventsConfig
from server.http.routes import resolve
from server.http.state import HttpState


def add_kv_event_routes(app: FastAPI, state: HttpState) -> None:
    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request, reset_running_requests: bool = False,
                                 reset_external: bool = False) -> JSONResponse:
        client, _ = resolve(state, request.query_params.get("model"))
        return JSONResponse({"success": await client.reset_prefix_cache(
            reset_running=reset_running_requests, reset_external=reset_external)})

    @app.get("/kv_event_sources")
    async def kv_event_sources(request: Request) -> JSONResponse:
        client, _ = resolve(state, request.query_params.get("model"))
        out = {}
        for info in client.infos:
            if not info.kv_events_endpoint:
                continue
            cfg = KVEventsConfig(True, "zmq", info.kv_events_endpoint,
                                 info.kv_events_replay_endpoint or None,
                                 topic=info.kv_events_topic)
            out[str(info.dp_rank)] = {"enable_kv_cache_events": True, "publisher": "zmq",
                                   "endpoint": cfg.endpoint,
                                   "replay_endpoint": cfg.replay_endpoint, "topic": cfg.topic}
        return JSONResponse(out)
