"""Batch chat completions, as vLLM 0.33.0 serves them (`POST /v1/chat/completions/batch`;
vllm/entrypoints/openai/chat_completion/{api_router,batch_serving}.py and its
`BatchChatCompletionRequest`): one body with N conversations, one chat completion whose
choice i answers conversation i.

Why: offline-evaluation and data-generation clients send their conversations in one request
to cut per-request overhead; a doppelchip pod answers them as a vLLM pod does, each
conversation a request of its own in the engine (its own prefix-cache match and timeline).

As vLLM: every field but `messages` is shared and applies to each conversation as to a chat
request (unknown fields too: vLLM's model keeps extras and passes them on); each
conversation is validated as a chat request (the same 400s); `n` must be 1, `use_beam_search`
false, `tool_choice` "none" (tools are not rendered nor parsed); the answer is never streamed;
`usage` sums the conversations; the response `id` is `chatcmpl-<id>` and conversation i is
`chatcmpl-<id>_<i>` in the engine (what `/abort_requests` takes). Admission is all or none
(vLLM admits each on its own).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import FastAPI
from pydantic import Field, ValidationError, model_validator
from starlette.requests import Request
from starlette.responses import Response

from server.frontend import request_ids
from server.frontend.lora import tag as lora_tag
from server.http import chat, generate, prompts, tools
from server.http.answering import counted
from server.http.errors import (
    HttpError,
    body_errors,
    error_response,
    validation_error,
)
from server.http.errors import vllm_invalid as invalid
from server.http.protocol import ChatCompletionRequest, ChatMessage, OpenAIBase, tokens_as_ids
from server.http.routes import (
    data_parallel_rank,
    engine_id,
    opened,
    parse,
    pinned,
    request_id,
    with_session,
)
from server.http.state import HttpState


class BatchChatCompletionRequest(OpenAIBase):
    """vLLM's request model: the fields it declares (the rest pass through as extras)."""

    messages: list[Annotated[list[ChatMessage], Field(min_length=1)]] = Field(min_length=1)
    model: str | None = None
    request_id: str | None = None
    n: int | None = 1
    use_beam_search: bool = False
    tool_choice: Literal["none"] | None = "none"

    @model_validator(mode="before")
    @classmethod
    def _batch_mode(cls, data: Any) -> Any:
        """vLLM's `check_batch_mode`."""
        if not isinstance(data, dict):
            return data
        if data.get("use_beam_search"):
            raise invalid("Batch chat completions do not support beam search. Please set "
                          "`use_beam_search` to False.", "use_beam_search")
        params = data.get("kv_transfer_params")
        if isinstance(params, dict) and params.get("prompt_token_ids") is not None:
            raise invalid("Batch chat completions do not support "
                          "`kv_transfer_params['prompt_token_ids']`: one pre-tokenized prompt "
                          "cannot serve several conversations.",
                          "kv_transfer_params.prompt_token_ids")
        n = data.get("n", 1)
        if n is not None and n != 1:
            raise invalid("Batch chat completions do not support `n > 1`. Please set `n` to 1.",
                          "n", n)
        return data


def conversations(body: BatchChatCompletionRequest) -> list[ChatCompletionRequest]:
    """One chat request per conversation: the shared fields and that conversation
    (vLLM's `to_chat_completion_request`), validated as a chat request."""
    shared = body.model_dump(exclude={"messages"}, exclude_none=True)
    shared.pop("tools", None)  # vLLM renders no tools for a batch
    out = []
    for conv in body.messages:
        messages = [m.model_dump(exclude_none=True) for m in conv]
        try:
            out.append(ChatCompletionRequest.model_validate({**shared, "messages": messages}))
        except ValidationError as e:
            raise validation_error(body_errors(e.errors(include_url=False))) from None
    return out


async def batch_chat_completion(state: HttpState, request: Request,
                                body: BatchChatCompletionRequest) -> Response:
    rid = request_id(request, body.request_id)
    try:
        client, name = opened(state, rid, body.model)
        singles = [with_session(tokens_as_ids(s, state.tokens_as_ids), request)
                   for s in conversations(body)]
        reqs, shapes_of = [], []
        for i, single in enumerate(singles):
            ids = await prompts.chat_generation_prompt(single, state.tokenizer, client.limits)
            plan = tools.plan(single)
            req, _ = chat.engine_request(single, engine_id(f"chatcmpl-{rid}_{i}"), ids, plan,
                                         client.limits)
            reqs.append(lora_tag(client, body.model, req))  # --- LoRA (issue 13) ---
            shapes_of.append((single, plan))
        run = await generate.admitted(client, pinned(reqs, data_parallel_rank(request)), 1,
                                      rid)
        await generate.collect(run, request)
    except HttpError as e:
        return error_response(e, rid)
    return Response(generate.encode(merged(run, shapes_of, f"chatcmpl-{rid}", name, state)),
                    media_type="application/json",
                    headers={"X-Request-Id": request_ids.metadata_value(rid)})


def merged(run: generate.Run, shapes_of: list, rid: str, name: str, state: HttpState) -> dict:
    """vLLM's batch answer: a chat completion whose choice i is conversation i's, `usage`
    summed, no prompt-level fields (prompt logprobs, prompt token ids)."""
    answers = []
    for i, (single, plan) in enumerate(shapes_of):
        one = generate.Run(run.client, [run.streams[i]], [run.choices[i]],
                           [run.prompt_lens[i]])
        answers.append(chat.ChatShapes(single, one, rid, name, state.tokenizer, plan, [],
                                       role=state.response_role).response())
    return {**answers[0], "choices": [c for a in answers for c in a["choices"]],
            "usage": run.usage_dump(), "prompt_logprobs": None, "prompt_token_ids": None,
            "kv_transfer_params": None}


def add_chat_batch_routes(app: FastAPI, state: HttpState) -> None:
    @app.post("/v1/chat/completions/batch")
    async def create_batch_chat_completion(request: Request) -> Response:
        body = await parse(request, BatchChatCompletionRequest)
        return await counted(state.load(), batch_chat_completion(state, request, body))
