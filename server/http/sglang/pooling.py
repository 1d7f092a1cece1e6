"""An SGLang pod of a pooling model (an embedding model, a cross-encoder, a converted
reranker): SGLang 0.5.23's routes for it, run by the same pooling machinery as a vLLM pod's
(`server.http.pooling`, `server.http.scores`).

- `POST|PUT /v1/rerank` (`V1RerankReqInput`: `query`, `documents`, `top_n`,
  `return_documents`): SGLang's answer is a JSON **list** of `{"score", "document", "index"}`,
  best first (the best `top_n`), `document` left out with `return_documents: false` — the
  shape smg's HTTP router reads a worker's rerank answer as (vLLM answers an object, which smg
  cannot read: docs/EMBEDDINGS.md). Its checks in its words: "Query cannot be empty",
  "Documents cannot be empty", "Each document must be a non-empty string", top_n ≥ 1.
- `POST /v1/embeddings`: the OpenAI embeddings route (vLLM's handler, as the OpenAI routes of
  a generative SGLang pod are).
- `POST|PUT /encode` (`EmbeddingReqInput`: `text` or `input_ids`, one or a list):
  `{"embedding": [...], "meta_info": {"id", "finish_reason", "prompt_tokens", ...}}`, a list
  for a list.
"""

from __future__ import annotations

import uuid

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.http import pooling
from server.http.embeddings import embeddings
from server.http.errors import HttpError
from server.http.pod_app import pod_client
from server.http.pooling_protocol import EmbeddingRequest, RerankRequest
from server.http.routes import parse
from server.http.scores import scored
from server.http.sglang.errors import sglang_error, with_json
from server.http.sglang.protocol import prompt_inputs
from server.http.state import HttpState


def _rerank_problem(body: dict) -> str | None:
    """`OpenAIServingRerank._validate_request`, and `top_n`'s validator."""
    query, docs = body.get("query"), body.get("documents")
    if not query:
        return "Query cannot be empty"
    if isinstance(query, str) and not query.strip():
        return "Query cannot be empty or whitespace only"
    if not isinstance(query, str):
        return "multimodal queries are not served by doppelchip: its models are text only"
    if not docs or not isinstance(docs, list):
        return "Documents cannot be empty"
    for doc in docs:
        if not doc:
            return "Each document must be a non-empty string"
        if not isinstance(doc, str):
            return "multimodal documents are not served by doppelchip: its models are text only"
        if not doc.strip():
            return "Each document cannot be empty or whitespace only"
    top_n = body.get("top_n")
    if top_n is not None and (not isinstance(top_n, int) or top_n < 1):
        return "Value error, parameter top_n should be larger than 0."
    return None


async def rerank(state: HttpState, request: Request, body: object) -> Response:
    if not isinstance(body, dict):
        return sglang_error(HttpError(400, "The request body must be a JSON object"))
    problem = _rerank_problem(body)
    if problem is not None:
        return JSONResponse({"object": "error", "message": problem, "type": "BadRequestError",
                             "param": None, "code": 400}, 400)
    name = pod_client(state).info.model_name
    req = RerankRequest.model_validate({"model": name, "query": body["query"],
                                        "documents": body["documents"]})
    out = await scored(state, request, req, req.query, req.documents, "Rerank (Score) API")
    if isinstance(out, Response):  # refused by the pooling checks: vLLM's body, made flat
        return out
    _, _, scores, _ = out
    keep = body.get("return_documents", True)
    results = sorted(({"score": s, **({"document": d} if keep else {}), "index": i}
                      for i, (d, s) in enumerate(zip(body["documents"], scores, strict=True))),
                     key=lambda r: r["score"], reverse=True)
    top_n = body.get("top_n")
    return JSONResponse(results[:top_n] if top_n else results)


async def encode(state: HttpState, request: Request, body: object) -> Response:
    """SGLang's `/encode`: the pooled vector of each prompt."""
    if not isinstance(body, dict):
        return sglang_error(HttpError(400, "The request body must be a JSON object"))
    try:
        inputs, batch = prompt_inputs(body)
        client = pod_client(state)
        name = client.info.model_name
        rid = str(body.get("rid") or uuid.uuid4().hex)
        prompts = await pooling.prompt_ids(inputs, client, state, True, None, None)
        params = pooling.check_params(client, name, client.limits.pooling_task, None, None)
        vectors = await pooling.pool(request, client, rid, f"embd-{rid}", prompts, params, 0,
                                     state.tokenizer.special_token_ids)
    except HttpError as e:
        return sglang_error(e)
    outs = [{"embedding": [float(x) for x in v],
             "meta_info": {"id": rid if len(prompts) == 1 else f"{rid}_{i}",
                           "finish_reason": {"type": "length", "length": 0},
                           "prompt_tokens": len(p), "weight_version": "default"}}
            for i, (p, v) in enumerate(zip(prompts, vectors, strict=True))]
    return JSONResponse(outs if batch else outs[0])


def add_pooling_routes(app: FastAPI, state: HttpState) -> None:
    limits = pod_client(state).limits
    if pooling.scores(limits):
        @app.api_route("/v1/rerank", methods=["POST", "PUT"])
        async def rerank_route(request: Request) -> Response:
            return await with_json(request, lambda body: rerank(state, request, body))

    if pooling.embeds(limits):
        @app.post("/v1/embeddings")
        async def embeddings_route(request: Request) -> Response:
            return await embeddings(state, request, await parse(request, EmbeddingRequest))

    @app.api_route("/encode", methods=["POST", "PUT"])
    async def encode_route(request: Request) -> Response:
        return await with_json(request, lambda body: encode(state, request, body))
