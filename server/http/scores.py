"""`/score` and `/rerank`: vLLM 0.33.0's scoring (`vllm/entrypoints/pooling/scoring/`). On an
embedding model (a bi-encoder) every query and every document is pooled on the deployment
(one engine request each), and a pair's score is the cosine of their vectors; on a classifier
of one label (a cross-encoder) each pair is one prompt (`server.http.cross_encoder`).

Pairs: one query against N documents (1:N), or N against N (pairwise); anything else is
vLLM's "Input lengths must be either 1:1, 1:N or N:N". `/rerank` answers its documents sorted
by score, the best `top_n` (0: all). `/v1/score` and `/v1/rerank` are vLLM's aliases (it logs
that they moved), `/v2/rerank` too. Usage counts every pooled prompt's tokens.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from server.frontend.pooled import cosine
from server.http import pooling
from server.http.answering import counted
from server.http.cross_encoder import cross_scores
from server.http.errors import HttpError, error_response, vllm_invalid
from server.http.generate import encode
from server.http.pooling_protocol import RerankRequest, ScoreRequest, ScoringFields
from server.http.routes import parse
from server.http.state import HttpState


def _sides(data_1: Any, data_2: Any, model: str) -> tuple[list[str], list[str]]:
    """vLLM's `validate_score_input`: texts only (this model is not multimodal), 1:1, 1:N or
    N:N."""
    one = data_1 if isinstance(data_1, list) else [data_1]
    two = data_2 if isinstance(data_2, list) else [data_2]
    if any(not isinstance(d, str) for d in (*one, *two)):
        raise vllm_invalid(f"MultiModalParam is not supported for {model}")
    if len(one) > 1 and len(one) != len(two):
        raise vllm_invalid("Input lengths must be either 1:1, 1:N or N:N")
    if not one:
        raise vllm_invalid("At least one text element must be given")
    if not two:
        raise vllm_invalid("At least one text_pair element must be given")
    return one, two


def _limit(value: int, name: str, max_model_len: int) -> int:
    """vLLM's `_validate_token_limit` (0: no limit)."""
    if value < 0:
        raise vllm_invalid(f"{name} must be a non-negative integer")
    if value and value >= max_model_len:
        raise vllm_invalid(f"{name} ({value}) must be less than max_model_len "
                           f"({max_model_len}).")
    return value


async def scored(state: HttpState, request: Request, body: ScoringFields, data_1: Any,
                 data_2: Any, api: str) -> tuple[str, str, list[float], int] | Response:
    """(response id, model name, each pair's score, prompt tokens), or the error answer."""
    rid, response_id = pooling.request_id(request, body.request_id, "score")
    try:
        client, name = pooling.pooling_client(state, body.model, api, pooling.scores)
        limit = client.limits.max_model_len
        per_query = _limit(body.max_tokens_per_query, "max_tokens_per_query", limit)
        per_doc = _limit(body.max_tokens_per_doc, "max_tokens_per_doc", limit)
        one, two = _sides(data_1, data_2, client.info.model)
        if pooling.classifies(client.limits):
            scores, n = await cross_scores(state, request, body, client, name, one, two,
                                           (per_query, per_doc), rid, response_id)
            return response_id, name, scores, n
        ids = await pooling.prompt_ids([*one, *two], client, state, True,
                                       body.truncate_prompt_tokens, body.truncation_side)
        # vLLM cuts a text to N tokens, then the tokenizer adds its special tokens (BOS here)
        ids = [p[:1 + cap] if cap else p
               for p, cap in zip(ids, [per_query] * len(one) + [per_doc] * len(two),
                                 strict=True)]
        params = pooling.check_params(client, name, client.limits.pooling_task, None,
                                      body.use_activation)
        vectors = await pooling.pool(request, client, rid, response_id, ids, params,
                                     body.priority, state.tokenizer.special_token_ids)
    except HttpError as e:
        return error_response(e, rid)
    queries, docs = vectors[:len(one)], vectors[len(one):]
    if len(queries) == 1:
        queries = queries * len(docs)
    scores = [cosine(q, d) for q, d in zip(queries, docs, strict=True)]
    return response_id, name, scores, sum(map(len, ids))


async def score(state: HttpState, request: Request, body: ScoreRequest) -> Response:
    out = await scored(state, request, body, body.data_1, body.data_2, "Score API")
    if isinstance(out, Response):
        return out
    response_id, name, scores, n = out
    return Response(encode({
        "id": response_id, "object": "list", "created": int(time.time()), "model": name,
        "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
        "usage": pooling.usage(n)}),
        media_type="application/json")


async def rerank(state: HttpState, request: Request, body: RerankRequest) -> Response:
    out = await scored(state, request, body, body.query, body.documents,
                       "Rerank (Score) API")
    if isinstance(out, Response):
        return out
    response_id, name, scores, n = out
    docs = body.documents if isinstance(body.documents, list) else [body.documents]
    results = sorted(({"index": i, "document": {"text": d, "multi_modal": None},
                       "relevance_score": s} for i, (d, s) in enumerate(zip(docs, scores,
                                                                            strict=True))),
                     key=lambda r: r["relevance_score"], reverse=True)
    if 0 < body.top_n < len(docs):
        results = results[:body.top_n]
    return Response(encode({"id": response_id, "model": name,
                            "usage": {"prompt_tokens": n, "total_tokens": n},
                            "results": results}), media_type="application/json")


def add_score_routes(app: FastAPI, state: HttpState | None) -> None:
    """vLLM mounts these for an embedding model or a classifier of one label
    (`enable_scoring_api`: embed → bi-encoder, classify → cross-encoder)."""
    for path in ("/score", "/v1/score"):
        @app.post(path)
        async def create_score(request: Request) -> Response:
            body = await parse(request, ScoreRequest)
            return await counted(state.load(), score(state, request, body))  # type: ignore

    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        @app.post(path)
        async def do_rerank(request: Request) -> Response:
            body = await parse(request, RerankRequest)
            return await counted(state.load(), rerank(state, request, body))  # type: ignore
