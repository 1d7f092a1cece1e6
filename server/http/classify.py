"""`/classify`: a classifier's label probabilities for each prompt, in vLLM 0.33.0's shape
(`vllm/entrypoints/pooling/classify/`).

A body is completion-style (`input`: a text, texts, token ids or lists of them) or a chat
(`messages`, one prompt through the template). Each prompt is pooled on the deployment (one
engine request each, `server.http.pooling`); its answer is the classifier's `probs` (a sigmoid
for one label, a softmax over several; the logits with `use_activation` false:
`server.frontend.classified`), its `label` the most likely one's name. A checkpoint converted
into a classifier declares no label names, so they are Hugging Face's defaults, `LABEL_i`, as
vLLM reads them from `id2label`.
"""

from __future__ import annotations

import time

import numpy as np
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from server.http import pooling
from server.http.answering import counted
from server.http.errors import HttpError, error_response
from server.http.generate import encode
from server.http.pooling_protocol import ClassificationRequest, ClassifyFields
from server.http.routes import parse
from server.http.state import HttpState


async def classify(state: HttpState, request: Request, body: ClassifyFields) -> Response:
    rid, response_id = pooling.request_id(request, body.request_id, "classify")
    try:
        client, name = pooling.pooling_client(state, body.model, "Classification API",
                                              pooling.classifies)
        params = pooling.check_params(client, name, "classify", None, body.use_activation)
        ids = await pooling.body_ids(state, client, body)
        probs = await pooling.pool(request, client, rid, response_id, ids, params,
                                   body.priority, state.tokenizer.special_token_ids)
    except HttpError as e:
        return error_response(e, rid)
    data = [{"index": i, "label": f"LABEL_{int(np.argmax(p))}", "probs": p.tolist(),
             "num_classes": len(p)} for i, p in enumerate(probs)]
    return Response(encode({"id": response_id, "object": "list", "created": int(time.time()),
                            "model": name, "data": data,
                            "usage": pooling.usage(sum(map(len, ids)))}),
                    media_type="application/json")


def add_classify_route(app: FastAPI, state: HttpState | None) -> None:
    """vLLM mounts it for a model whose pooling task is `classify`."""

    @app.post("/classify")
    async def create_classify(request: Request) -> Response:
        body = await parse(request, ClassificationRequest)
        return await counted(state.load(), classify(state, request, body))  # type: ignore
