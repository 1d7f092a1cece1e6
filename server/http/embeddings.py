"""`/v1/embeddings` and `/pooling`: a pooling model's vectors, in vLLM 0.33.0's shapes
(`vllm/entrypoints/pooling/embed/serving.py`, `pooling/serving.py`, `utils.py`).

`encoding_format`: `float` (a list of numbers), `base64` (the vector's bytes in `embed_dtype`
and `endianness`), `bytes` (the vectors' bytes back to back, `application/octet-stream`, with
the ids, shapes and offsets as JSON in a `metadata` header) or `bytes_only` (no header).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from server.engine.intake import Limits
from server.frontend.pooled import binary, encode_base64
from server.http import pooling
from server.http.answering import counted
from server.http.errors import HttpError, error_response, vllm_invalid
from server.http.generate import encode
from server.http.pooling_protocol import (
    EmbeddingRequest,
    EmbedFields,
    PoolingRequest,
)
from server.http.routes import parse
from server.http.state import HttpState

# vLLM's supported tasks of an embedding model's and a classifier's pooler
SUPPORTED_TASKS = {"embed": ("embed", "token_embed"), "classify": ("classify", "token_classify")}


def _answer(body: EmbedFields, response_id: str, name: str, ids: list[list[int]],
            vectors: list[np.ndarray], shape: Shape) -> Response:
    fmt, dtype, order = body.encoding_format, body.embed_dtype, body.endianness
    created = int(time.time())
    if fmt in ("bytes", "bytes_only"):
        chunks = [binary(v, dtype, order) for v in vectors]
        items, start = [], 0
        for i, (v, chunk) in enumerate(zip(vectors, chunks, strict=True)):
            items.append({"index": i, "embed_dtype": dtype, "endianness": order,
                          "start": start, "end": start + len(chunk), "shape": list(v.shape)})
            start += len(chunk)
        headers = None if fmt == "bytes_only" else {"metadata": json.dumps({
            "id": response_id, "created": created, "model": name, "data": items,
            "usage": {"prompt_tokens": (n := sum(map(len, ids))), "total_tokens": n}})}
        return Response(b"".join(chunks), media_type="application/octet-stream",
                        headers=headers)
    data = [{"index": i, "object": shape.obj,
             shape.key: v.tolist() if fmt == "float" else encode_base64(v, dtype, order)}
            for i, v in enumerate(vectors)]
    return Response(encode({"id": response_id, "object": "list", "created": created,
                            "model": name, "data": data,
                            "usage": pooling.usage(sum(map(len, ids)))}),
                    media_type="application/json")


@dataclass(frozen=True)
class Shape:
    """What tells the two routes' answers apart: the id prefix, the API's name in a 501 and
    which models serve it, the items' `object` and the key of their vector."""

    prefix: str
    api: str
    serves: Callable[[Limits], bool]
    obj: str
    key: str


EMBEDDINGS = Shape("embd", "Embeddings API", pooling.embeds, "embedding", "embedding")
POOLING = Shape("pool", "Pooling API", pooling.pools, "pooling", "data")


async def embeddings(state: HttpState, request: Request, body: EmbedFields) -> Response:
    """`/v1/embeddings` (and `/invocations`'s embeddings body)."""
    return await _run(state, request, body, EMBEDDINGS)


async def pooled(state: HttpState, request: Request, body: EmbedFields) -> Response:
    """`/pooling` (and `/invocations`'s pooling body)."""
    return await _run(state, request, body, POOLING)


async def _run(state: HttpState, request: Request, body: EmbedFields, shape: Shape
               ) -> Response:
    rid, response_id = pooling.request_id(request, body.request_id, shape.prefix)
    try:
        client, name = pooling.pooling_client(state, body.model, shape.api, shape.serves)
        task = client.limits.pooling_task
        if shape is POOLING:  # vLLM's _verify_pooling_task
            if body.dimensions is not None:
                raise vllm_invalid("dimensions is currently not supported", "dimensions")
            asked, supported = body.task or task, SUPPORTED_TASKS[task]  # type: ignore
            if asked != task:
                raise vllm_invalid(
                    f"Try switching the model's pooling_task via --pooler-config.task {asked}."
                    if asked in supported else
                    f"Unsupported task: {asked!r} Supported tasks: {supported}", "task")
        params = pooling.check_params(client, name, task, body.dimensions, body.use_activation)
        ids = await pooling.body_ids(state, client, body)
        vectors = await pooling.pool(request, client, rid, response_id, ids, params,
                                     body.priority, state.tokenizer.special_token_ids)
    except HttpError as e:
        return error_response(e, rid)
    return _answer(body, response_id, name, ids, vectors, shape)


def add_embedding_routes(app: FastAPI, state: HttpState | None) -> None:
    """vLLM mounts `/pooling` for any pooling model, `/v1/embeddings` for an embedding model
    (`register_pooling_api_routers`)."""
    if pooling.any_pooling(state, pooling.embeds):
        @app.post("/v1/embeddings")
        async def create_embedding(request: Request) -> Response:
            body = await parse(request, EmbeddingRequest)
            return await counted(state.load(), embeddings(state, request, body))  # type: ignore

    @app.post("/pooling")
    async def create_pooling(request: Request) -> Response:
        body = await parse(request, PoolingRequest)
        return await counted(state.load(), pooled(state, request, body))  # type: ignore
