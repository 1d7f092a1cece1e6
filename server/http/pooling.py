"""Running a pooling model's request: its prompts pooled on the deployment, each answered when
its prefill ends with the emulated output of its task: an embedding model's vector
(`server.frontend.pooled`), a classifier's probabilities (`server.frontend.classified`).

The lifecycle of one `/v1/embeddings`, `/pooling`, `/classify`, `/score`, `/rerank` or
`/v2/embed` call:
1. `pooling_client`: the deployment its `model` names (a pod of one deployment answers any
   name, as vLLM's pooling routes do not check it), or 501 when that model's task has no such
   route (`embeds`, `classifies`, `scores`, `pools`: vLLM's route table per task);
2. `prompt_ids`: each input tokenized, truncated (`truncate_prompt_tokens`; a pooling
   tokenizer truncates on the right, vLLM's `truncation_side` for the pooling runner) and
   checked against the context (a prompt may fill it: nothing is generated);
3. `check_params`: `dimensions` and `use_activation` as vLLM's `PoolingParams.verify`;
4. `run`: one engine request per prompt (`pooling` set: it ends with its prefill), all
   admitted or none, collected, always freed (`generate.collect`); `pool` adds each prompt's
   answer (`output`).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from starlette.requests import Request

from server.engine.intake import Limits
from server.engine.interface import EngineRequest, PoolingParams
from server.fleet import UnknownDeployment
from server.frontend.classified import activated, label_logits
from server.frontend.deployment import INLINE_TOKENIZE_CHARS, DeploymentClient
from server.frontend.pooled import prompt_vector
from server.http import generate, lengths, prompts, routes
from server.http.errors import HttpError, draining, unknown_model, vllm_invalid
from server.http.pooling_protocol import ChatInput, PoolingFields
from server.http.state import HttpState


def embeds(limits: Limits) -> bool:
    """An embedding model's routes (`/v1/embeddings`, `/v2/embed`)."""
    return limits.pooling_task == "embed"


def classifies(limits: Limits) -> bool:
    """A classifier's route (`/classify`)."""
    return limits.pooling_task == "classify"


def scores(limits: Limits) -> bool:
    """`/score` and `/rerank` (vLLM's `enable_scoring_api`): an embedding model (bi-encoder),
    or a classifier of one label (cross-encoder)."""
    return embeds(limits) or (classifies(limits) and limits.num_labels == 1)


def pools(limits: Limits) -> bool:
    """`/pooling`: any pooling model."""
    return bool(limits.pooling_task)


def pooling_client(state: HttpState, model: str | None, api: str,
                   serves: Callable[[Limits], bool] = pools) -> tuple[DeploymentClient, str]:
    """The deployment and the name its answers carry (its first served name, as vLLM's
    `models.model_name()`), or 501 "The model does not support {api}" (vLLM's answer when the
    route exists but the model has no such task: `serves` says which have)."""
    if state.draining:
        raise draining()
    fleet = state.fleet
    try:
        client = fleet.resolve("", model or "")
    except UnknownDeployment:
        if len(fleet.clients) != 1:
            raise unknown_model(model or "", fleet.model_names()) from None
        client = next(iter(fleet.clients.values()))
    if not serves(client.limits):
        raise HttpError(501, f"The model does not support {api}", "NotImplementedError")
    return client, client.info.model_name


def any_pooling(state: HttpState | None, serves: Callable[[Limits], bool] = pools) -> bool:
    """Whether a deployment of the pod `serves` a route (None: the route table)."""
    return state is None or any(serves(c.limits) for c in state.fleet.clients.values())


def all_pooling(state: HttpState | None) -> bool:
    """Whether every deployment of the pod is a pooling model (vLLM then mounts no
    generation route)."""
    return state is not None and bool(state.fleet.clients) and all(
        c.limits.pooling_task for c in state.fleet.clients.values())


def request_id(request: Request, body_id: str | None, prefix: str) -> tuple[str, str]:
    """(the client's id, the response's `id`: `<prefix>-<id>`), vLLM's `_base_request_id`."""
    rid = routes.request_id(request, body_id)
    routes.checked_id(rid)
    return rid, f"{prefix}-{rid}"


async def prompt_ids(inputs: Sequence[str | list[int]], client: DeploymentClient,
                     state: HttpState, add_special_tokens: bool, truncate: int | None,
                     side: str | None) -> list[list[int]]:
    """Each input's token ids, truncated and checked (steps 2)."""
    if not inputs:
        raise vllm_invalid("You must pass at least one prompt")
    limit, tok = client.limits.max_model_len, state.tokenizer
    if truncate is not None and truncate > limit:
        raise vllm_invalid("truncate_prompt_tokens value is greater than max_model_len. "
                           "Please request a smaller truncation size.")
    texts = [t for t in inputs if isinstance(t, str)]
    prompts.check_texts(texts, client.limits)
    if sum(map(len, texts)) <= INLINE_TOKENIZE_CHARS:
        encoded = [tok.encode(t) if isinstance(t, str) else list(t) for t in inputs]
    else:
        encoded = await asyncio.to_thread(
            lambda: [tok.encode_unlocked(t) if isinstance(t, str) else list(t) for t in inputs])
    out = []
    for given, ids in zip(inputs, encoded, strict=True):
        text = isinstance(given, str)
        if text and add_special_tokens:
            ids = [tok.bos_token_id, *ids]
        keep = limit if truncate == -1 else truncate
        out.append(lengths.fit_prompt(ids, limit, truncate=keep, side=side or "right",
                                      from_text=text, keeps_bos=text and add_special_tokens))
    return out


async def body_ids(state: HttpState, client: DeploymentClient,
                   body: PoolingFields) -> list[list[int]]:
    """A body's prompts as token ids (steps 2): its chat rendered by the template (one
    prompt), or its `input`s."""
    if isinstance(body, ChatInput):
        ids = await prompts.chat_prompt(body.messages, state.tokenizer, client.limits,
                                        body.add_generation_prompt, body.continue_final_message)
        ids = [state.tokenizer.bos_token_id, *ids] if body.add_special_tokens else ids
        given: list[Any] = [ids]
        add = False
    else:
        x = body.input  # type: ignore[attr-defined]
        given = [x] if isinstance(x, str) or (x and isinstance(x[0], int)) else list(x)
        add = body.add_special_tokens  # type: ignore[attr-defined]
    return await prompt_ids(given, client, state, add, body.truncate_prompt_tokens,
                            body.truncation_side)


def check_params(client: DeploymentClient, name: str, task: str, dimensions: int | None,
                 use_activation: bool | None) -> PoolingParams:
    """The request's PoolingParams, checked as vLLM's `PoolingParams.verify` checks them: what
    it leaves unset takes `--pooler-config`'s default first (`_merge_default_parameters`:
    `dimensions` for embeddings, `use_activation` for both tasks)."""
    limits = client.limits
    if use_activation is None:
        use_activation = limits.default_use_activation
    if dimensions is None and task == "embed":
        dimensions = limits.default_dimensions
    if dimensions is not None:
        size = limits.embedding_size
        if not limits.matryoshka:
            raise vllm_invalid(f"Model {name!r} does not support Matryoshka embeddings; "
                               f"dimensions must be unset (received dimensions={dimensions}).")
        if not 1 <= dimensions <= size:
            raise vllm_invalid(f"Model {name!r} only supports dimensions in range [1, {size}], "
                               f"got {dimensions}.")
        allowed = limits.matryoshka_dimensions
        if allowed and dimensions not in allowed:
            raise vllm_invalid(f"Model {name!r} only supports Matryoshka dimensions "
                               f"{list(allowed)}, got {dimensions}.")
    return PoolingParams(task=task, dimensions=dimensions,  # type: ignore[arg-type]
                         use_activation=True if use_activation is None else use_activation)


async def run(request: Request, client: DeploymentClient, rid: str, response_id: str,
              ids: list[list[int]], params: PoolingParams, priority: int = 0) -> None:
    """Step 4: every prompt pooled on the deployment (one engine request each: all admitted
    or none), returning when every prefill has ended; always freed (`generate.collect`)."""
    reqs = [EngineRequest(request_id=routes.engine_id(f"{response_id}-{i}"),
                          prompt_token_ids=tuple(p), priority=priority, pooling=params)
            for i, p in enumerate(ids)]
    started = await generate.admitted(client, reqs, 1, rid)
    await generate.collect(started, request)


async def pool(request: Request, client: DeploymentClient, rid: str, response_id: str,
               ids: list[list[int]], params: PoolingParams, priority: int = 0,
               special: frozenset[int] = frozenset()) -> list[np.ndarray]:
    """Every prompt pooled (`run`); their answers, in order (`output`)."""
    await run(request, client, rid, response_id, ids, params, priority)
    return [output(p, client.limits, params, special) for p in ids]


def output(ids: list[int], limits: Limits, params: PoolingParams,
           special: frozenset[int]) -> np.ndarray:
    """One pooled prompt's answer: an embedding model's vector, or a classifier's
    probabilities (its logits without `use_activation`)."""
    if params.task == "classify":
        logits = label_logits(ids, limits.num_labels, limits.embedding_size, special)
        return np.asarray(activated(logits, params.use_activation, limits.logit_mean,
                                    limits.logit_sigma), dtype=np.float32)
    return prompt_vector(ids, limits.embedding_size, params, special)


def usage(n: int) -> dict:
    """vLLM's `UsageInfo` of a pooling answer of `n` prompt tokens, prompt tokens only
    (`prompt_tokens_details`, None here, is left out as vLLM 0.34.0 leaves it out)."""
    return {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0,
            "completion_tokens_details": None}
