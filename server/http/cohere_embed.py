"""Cohere's `POST /v2/embed` on an embedding model, as vLLM 0.33.0 serves it
(`vllm/entrypoints/pooling/embed/`: `CohereEmbedRequest`, the embed IO processor's Cohere
path, `build_typed_embeddings`, `_build_cohere_response_from_ctx`).

- `texts`, or `inputs` whose text parts make one user message each (rendered by the chat
  template, as vLLM renders mixed inputs); `images` and image parts are refused: the
  catalogue's embedding models read text only.
- `input_type` selects the model's task instruction (`ModelSpec.task_instructions`, its
  Sentence Transformers `prompts`: Qwen3-Embedding's `query` is an instruction, its `document`
  none). With one, a text is rendered as a chat of that instruction (system) and the text
  (user), as vLLM does for a model with a chat template. A type the model does not define is
  vLLM's 400.
- `truncate`: `END` (the default) keeps the first `max_tokens` tokens (or the context), `START`
  the last, `NONE` refuses an input longer than `max_tokens`.
- `output_dimension` is Matryoshka's `dimensions` (`pooling.check_params`).
- `embedding_types` (default `float`): `float`, `base64` (little-endian float32), `binary` /
  `ubinary` (signs packed 8 to a byte, most significant bit first; `binary` as signed bytes).
"""

from __future__ import annotations

import numpy as np
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from server.frontend.deployment import DeploymentClient
from server.frontend.pooled import encode_base64
from server.http import lengths, pooling, prompts
from server.http.answering import counted
from server.http.errors import HttpError, error_response, vllm_invalid
from server.http.generate import encode
from server.http.pooling_protocol import CohereEmbedRequest
from server.http.protocol import ChatMessage
from server.http.routes import parse
from server.http.state import HttpState


def instruction(client: DeploymentClient, input_type: str | None) -> str | None:
    """The task instruction of `input_type` (None: none), or vLLM's 400 for an unknown one."""
    if input_type is None:
        return None
    known = dict(client.limits.task_instructions)
    if not known:
        raise vllm_invalid(f"Unsupported input_type {input_type!r}. This model does not "
                           "define any input_type task instructions.")
    if input_type not in known:
        raise vllm_invalid(f"Unsupported input_type {input_type!r}. Supported values: "
                           f"{', '.join(sorted(known))}")
    return known[input_type] or None


def truncation(body: CohereEmbedRequest) -> tuple[int | None, str | None]:
    """vLLM's `_resolve_cohere_truncation`: (truncate_prompt_tokens, side)."""
    if body.truncate == "NONE":
        return None, None
    return (body.max_tokens if body.max_tokens is not None else -1,
            "left" if body.truncate == "START" else None)


async def prompt_ids(state: HttpState, client: DeploymentClient, body: CohereEmbedRequest
                     ) -> list[list[int]]:
    prefix = instruction(client, body.input_type)
    truncate, side = truncation(body)
    if body.texts is not None and prefix is None:
        return await pooling.prompt_ids(list(body.texts), client, state, True, truncate, side)
    chats = ([t] for t in body.texts or ()) if body.texts is not None else (
        [p.text or "" for p in i.content] for i in body.inputs or ())
    limit, out = client.limits.max_model_len, []
    for parts in chats:
        messages = [ChatMessage(role="system", content=prefix)] if prefix else []
        messages.append(ChatMessage(role="user", content="\n".join(parts)))
        ids = await prompts.chat_prompt(messages, state.tokenizer, client.limits, False)
        out.append(lengths.fit_prompt(ids, limit, truncate=limit if truncate == -1 else truncate,
                                      side=side or "right", from_text=True))
    return out


def typed(vectors: list[np.ndarray], types: list[str]) -> dict:
    """vLLM's `build_typed_embeddings`, in its fields' order."""
    out: dict = {}
    floats = np.asarray(vectors, dtype=np.float64)
    if {"binary", "ubinary"} & set(types) and floats.shape[1] % 8:
        raise vllm_invalid("Embedding dimension must be a multiple of 8 for binary embedding "
                           f"types, but got {floats.shape[1]}.")
    packed = np.packbits(floats >= 0, axis=-1)
    for kind in ("float", "binary", "ubinary", "base64"):
        if kind not in types:
            continue
        out[kind] = (floats.tolist() if kind == "float" else
                     (packed.astype(np.int16) - 128).tolist() if kind == "binary" else
                     packed.tolist() if kind == "ubinary" else
                     [encode_base64(v, "float32", "little") for v in vectors])
    return out


async def cohere_embed(state: HttpState, request: Request, body: CohereEmbedRequest
                       ) -> Response:
    rid, response_id = pooling.request_id(request, None, "embd")
    try:
        client, name = pooling.pooling_client(state, body.model, "Embeddings API",
                                              pooling.embeds)
        if body.images is not None or any(p.type == "image_url" for i in body.inputs or ()
                                          for p in i.content):
            raise vllm_invalid(f"images are not supported: {client.info.model} is a text "
                               "embedding model")
        params = pooling.check_params(client, name, client.limits.pooling_task,
                                      body.output_dimension, None)
        ids = await prompt_ids(state, client, body)
        if body.truncate == "NONE" and body.max_tokens is not None \
                and (n := max(map(len, ids))) > body.max_tokens:
            raise vllm_invalid(f"Input of {n} tokens exceeds max_tokens={body.max_tokens} with "
                               "truncate=NONE. Set truncate to END or START to allow truncation.")
        vectors = await pooling.pool(request, client, rid, response_id, ids, params,
                                     body.priority, state.tokenizer.special_token_ids)
        embeddings = typed(vectors, list(body.embedding_types or ["float"]))
    except HttpError as e:
        return error_response(e, rid)
    answer = {"id": response_id, "embeddings": embeddings}
    if body.texts is not None:
        answer["texts"] = body.texts
    answer["meta"] = {"api_version": {"version": "2"},
                      "billed_units": {"input_tokens": sum(map(len, ids)), "image_tokens": 0}}
    answer["response_type"] = "embeddings_by_type"
    return Response(encode(answer), media_type="application/json")


def add_cohere_route(app: FastAPI, state: HttpState | None) -> None:
    @app.post("/v2/embed")
    async def create_cohere_embedding(request: Request) -> Response:
        body = await parse(request, CohereEmbedRequest)
        return await counted(state.load(), cohere_embed(state, request, body))  # type: ignore
