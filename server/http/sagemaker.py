"""SageMaker's inference route as vLLM serves it (`vllm/entrypoints/sagemaker/api_router.py`):
`POST /invocations` takes any generation body and answers it as the route whose request it is —
a chat request first, then a completions request (vLLM's `INVOCATION_TYPES` order for a
generating model) — so a SageMaker-style container test (`/ping` + `/invocations`) runs against
a doppelchip pod as against a vLLM pod. A pod of embedding models answers an embeddings, rerank,
score or pooling body instead, in that order (vLLM's for the embed task; docs/EMBEDDINGS.md).

As vLLM: the body must be `application/json` (the same 400 as every route's); bad JSON is a 400
"JSON decode error: …"; a body that validates as neither is a 400 "Cannot find suitable handler
for request. Expected one of: ['ChatCompletionRequest', 'CompletionRequest']"; a vLLM check
inside a request's own validation (`server.http.prechecks`: say `stream_options` without
`stream`, or a body with no `prompt` that was not chat) is that request's 400, not a
fall-through, since vLLM's `VLLMValidationError` is no pydantic error; the
`X-Amzn-SageMaker-Adapter-Identifier` header names the model (a LoRA adapter,
`inject_adapter_id`); the request counts in `/load` like the route it becomes.
"""

from __future__ import annotations

import json

from fastapi import FastAPI
from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from server.http.answering import counted
from server.http.body import UNSUPPORTED_MEDIA, media_type_ok, unicode_checked
from server.http.classify import classify
from server.http.embeddings import embeddings, pooled
from server.http.errors import HttpError, bad_request, validation_error
from server.http.pooling import all_pooling, any_pooling, classifies, embeds, pools, scores
from server.http.pooling_protocol import (
    ClassificationRequest,
    EmbeddingRequest,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
)
from server.http.protocol import ChatCompletionRequest, CompletionRequest
from server.http.routes import chat_completion, completion
from server.http.scores import rerank, score
from server.http.state import HttpState

ADAPTER_HEADER = "x-amzn-sagemaker-adapter-identifier"
_HANDLERS = (("ChatCompletionRequest", ChatCompletionRequest, chat_completion),
             ("CompletionRequest", CompletionRequest, completion))


# a pooling model's, each for the models it serves (vLLM's get_pooling_invocation_types order)
_POOLING = (("EmbeddingRequest", EmbeddingRequest, embeddings, embeds),
            ("ClassificationRequest", ClassificationRequest, classify, classifies),
            ("RerankRequest", RerankRequest, rerank, scores),
            ("ScoreRequest", ScoreRequest, score, scores),
            ("PoolingRequest", PoolingRequest, pooled, pools))


def add_sagemaker_routes(app: FastAPI, state: HttpState) -> None:
    # the bodies this pod takes, in vLLM's order (its deployments are fixed once it serves)
    handlers = ([h[:3] for h in _POOLING if any_pooling(state, h[3])]
                if all_pooling(state) else _HANDLERS)

    @app.post("/invocations")
    async def invocations(request: Request) -> Response:
        if not media_type_ok(request.headers.get("content-type", "")):
            raise validation_error([UNSUPPORTED_MEDIA])
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise HttpError(400, f"JSON decode error: {e}") from None
        except RecursionError:  # nested too deep for `json.loads`: FastAPI's answer
            raise HttpError(400, "There was an error parsing the body") from None
        unicode_checked(raw, body)
        adapter = request.headers.get(ADAPTER_HEADER)
        if adapter and isinstance(body, dict):
            body = {**body, "model": adapter}
        for _, model, handler in handlers:
            try:
                req = (model.validate_python(body) if isinstance(model, TypeAdapter)
                       else model.model_validate(body))
            except ValidationError:
                continue
            return await counted(state.load(), handler(state, request, req))
        names = [name for name, _, _ in handlers]
        raise bad_request(f"Cannot find suitable handler for request. Expected one of: {names}")
