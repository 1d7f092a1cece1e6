"""vLLM's RL routes for pausing generation around weight updates, as vLLM 0.33.0 serves them
with VLLM_SERVER_DEV_MODE=1 (vllm/entrypoints/rl/online/api_router.py): `POST /pause?mode=
&clear_cache=`, `POST /resume`, `GET /is_paused`, `POST /abort_requests`, the weight version
label (`POST /update_weight_version`, `GET /weight_info`: every output token is sampled under
the engine's label, which `return_weight_versions` reports per choice), `GET /get_world_size`.

Why: RL trainers (verl, SkyRL, prime-rl and the like) drive their vLLM pods through these
between rollouts; a doppelchip pod answers them as such a pod does. What a pause does to the
requests is the engine's (server/engine_proc/pause.py); a command reaches every deployment
this front end serves (a pod serves one) and returns once every engine applied it — with mode
wait, once the running requests finished. `/abort_requests` ends this front end's requests,
as each of vLLM's API servers aborts its own. The weight-transfer routes are not served:
there are no weights to move; a trainer that moves weights by its own means labels them with
`/update_weight_version`.
"""

from __future__ import annotations

import json
import os
import re
from typing import Annotated, Literal

from fastapi import Body, FastAPI, Query
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.engine.errors import EngineError, InvalidRequest
from server.frontend.stream import RequestStream
from server.http.errors import HttpError, error_response
from server.http.state import HttpState
from server.ipc import messages as m

ENV = "VLLM_SERVER_DEV_MODE"
# an engine id (routes.engine_id): [n>1 child "j_"] client-facing id "-" 8 hex [prompt "_i"]
_ENGINE_ID = re.compile(r"(?:\d+_)?(.+)-[0-9a-f]{8}(?:_\d+)?")


def dev_mode() -> bool:
    """vLLM's development endpoints are on (`VLLM_SERVER_DEV_MODE=1`)."""
    return os.environ.get(ENV, "0").strip() not in ("", "0")


def external_ids(stream: RequestStream) -> set[str]:
    """The ids an abort may name a request by: the response's id (`chatcmpl-<id>`,
    `cmpl-<id>`: vLLM's external request id), the engine's id, and the client's own."""
    ids = {stream.request_id}
    if (found := _ENGINE_ID.fullmatch(stream.request_id)) is not None:
        ids.add(found.group(1))
    if stream.client_id is not None:
        ids.add(stream.client_id)
    return ids


def add_rl_routes(app: FastAPI, state: HttpState) -> None:
    async def to_all(make) -> None:
        await state.fleet.control(make)

    async def run(make, done: str, failed: str) -> JSONResponse:
        try:
            await to_all(make)
        except InvalidRequest as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        except EngineError as e:
            return JSONResponse({"error": f"Failed to {failed}: {e}"}, status_code=500)
        return JSONResponse({"status": done})

    @app.post("/pause")
    async def pause(mode: Annotated[Literal["abort", "wait", "keep"], Query()] = "abort",
                    clear_cache: Annotated[bool, Query()] = True) -> JSONResponse:
        return await run(lambda fe, seq: m.Pause(fe, seq, mode, clear_cache), "paused",
                         "pause generation")

    @app.post("/resume")
    async def resume() -> JSONResponse:
        return await run(lambda fe, seq: m.Resume(fe, seq), "resumed", "resume generation")

    @app.get("/is_paused")
    async def is_paused() -> JSONResponse:
        return JSONResponse({"is_paused": any(
            c.is_paused() for c in state.fleet.clients.values())})

    # --- vLLM's weight version label (the RL trainer's policy version) and world size ---
    @app.post("/update_weight_version")
    async def update_weight_version(new_version: Annotated[str, Body(embed=True)]
                                    ) -> JSONResponse:
        try:
            await to_all(lambda fe, seq: m.WeightVersion(fe, seq, new_version))
        except EngineError as e:
            return JSONResponse({"error": f"Failed to update the weight version: {e}"},
                                status_code=500)
        return JSONResponse({"success": True, "new_version": new_version})

    @app.get("/weight_info")
    async def weight_info() -> JSONResponse:
        client = state.fleet.get(state.fleet.default_name)
        try:
            answers = await client.control(lambda fe, seq: m.WeightVersion(fe, seq))
        except EngineError as e:
            return JSONResponse({"error": f"Failed to get the weight version: {e}"},
                                status_code=500)
        return JSONResponse({"weight_version": answers[0].message})

    @app.get("/get_world_size")
    async def get_world_size(include_dp: Annotated[bool, Query()] = True) -> JSONResponse:
        """vLLM's parallel_config.world_size (tp × pp), × the data-parallel size with
        include_dp (its default): the chips of the default deployment (a pod's)."""
        client = state.fleet.get(state.fleet.default_name)
        info = client.infos[0]
        world = max(1, info.tensor_parallel) * max(1, info.pipeline_parallel)
        return JSONResponse({"world_size": world * (len(client.infos) if include_dp else 1)})

    @app.post("/abort_requests")
    async def abort_requests(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response(HttpError(400, "Invalid JSON format"))
        if not isinstance(body, dict):
            return error_response(HttpError(400, "Request body must be a JSON object"))
        ids = body.get("request_ids")
        if isinstance(ids, str):
            ids = [ids]
        if ids and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
            return error_response(HttpError(400, "request_ids must be a list of strings",
                                            "BadRequestError", "request_ids"))
        aborted = abort_matching(state, ids or None)
        return JSONResponse({"status": "aborted", "aborted": len(ids) if ids else aborted})


def abort_matching(state: HttpState, ids: list[str] | None) -> int:
    """End this front end's requests named by `ids` (`external_ids`; None: every one) with
    finish reason abort, freeing their KV (vLLM's `abort(request_ids)`); how many ended."""
    aborted = 0
    for client in state.fleet.clients.values():
        for stream in list(client.streams.values()):
            if ids is None or not external_ids(stream).isdisjoint(ids):
                client.cancel(stream)
                aborted += 1
    return aborted
