"""vLLM 0.33.0's scale-out routes (vllm/entrypoints/scale_out/): rendering a request into the
token ids and sampling parameters the engine would run (`/v1/chat/completions/render`,
`/v1/completions/render`, `/v1/messages/render`, `/v1/responses/render`), and generating
from token ids (`/inference/v1/generate`, `/inference/v1/abort_requests`) — served with
`--enable-scale-out` (`[server] enable_scale_out`), each a 403 PermissionDeniedError without
it, as vLLM.

Why: routers that route on tokens (prefix-cache-aware endpoint pickers) ask a pod to render
a request before they pick one, and RL rollouts render a conversation once, then generate
from its token ids so that no text round trip changes a token. Render answers exactly the
token ids the chat and completions routes would run (the same `prompts` and `lengths`
functions), with vLLM's `SamplingParams` as it serializes (`scale_out_protocol`); generate
runs the token ids as a completions request over token ids would run them, and answers
vLLM's `GenerateTokensResponse` (or `GenerateTextResponse`, `output_mode: "text"`), JSON or
SSE. Derendering is 501: decode ids with `/detokenize`.
"""

from __future__ import annotations

import time

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.http import chat, completions, prompts, tools
from server.http.answering import answer, counted
from server.http.body import validated
from server.http.errors import HttpError, bad_request, draining, error_response
from server.http.messages_protocol import MessagesRequest
from server.http.messages_routes import to_chat
from server.http.protocol import ChatCompletionRequest, CompletionRequest
from server.http.render_metrics import rendering
from server.http.responses import new_id
from server.http.responses import to_chat as to_chat_request
from server.http.responses_protocol import ResponsesRequest
from server.http.rl import abort_matching
from server.http.routes import (
    checked_id,
    data_parallel_rank,
    parse,
    request_id,
    resolve,
    start_completion,
    with_session,
)
from server.http.scale_out_generate import GenerateShapes, completion_body
from server.http.scale_out_protocol import (
    AbortRequestsRequest,
    GenerateRequest,
    generate_request,
    sampling_params,
)
from server.http.state import HttpState

DISABLED = ("Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to "
            "enable them.")
RENDER = ("/v1/chat/completions/render", "/v1/messages/render", "/v1/completions/render",
          "/v1/responses/render")
DERENDER = ("/v1/chat/completions/derender", "/v1/completions/derender")
TOKENS = ("/inference/v1/generate", "/inference/v1/abort_requests")


def _beam_search(body) -> None:
    if (body.model_extra or {}).get("use_beam_search"):
        raise bad_request("Beam search is not supported by the render endpoint")


async def render_chat(state: HttpState, request: Request, body: ChatCompletionRequest,
                      timed: bool = True) -> dict:
    """One chat request rendered (vLLM's `render_chat_request`); `timed`: its render is
    observed (render_metrics: not a Responses request's)."""
    rid = request_id(request, body.request_id)
    checked_id(rid)
    client, _ = resolve(state, body.model)
    _beam_search(body)
    plan = tools.plan(body)
    with rendering(state, client.info.model_name, "chat", timed):
        ids = await prompts.chat_generation_prompt(body, state.tokenizer, client.limits)
    req, _ = chat.engine_request(body, rid, ids, plan, client.limits)
    logprobs = body.top_logprobs if body.logprobs else None
    params = sampling_params(body, req.sampling.max_tokens, logprobs, body.prompt_logprobs)
    choice = body.tool_choice if body.tool_choice is not None else (
        "auto" if body.tools else "none")  # vLLM's default, as `tools.plan` resolves it
    context = {"tools": [t.model_dump() for t in body.tools] if body.tools else None,
               "tool_choice": choice if isinstance(choice, str) else choice.model_dump(),
               "parallel_tool_calls": body.parallel_tool_calls, "include_reasoning": True,
               "chat_template_kwargs": (body.model_extra or {}).get("chat_template_kwargs")
               or {},
               "history_tool_call_cnt": sum(len(m.tool_calls or ()) for m in body.messages)}
    return generate_request(f"chatcmpl-{rid}", ids, params, body, context)


async def render_responses(state: HttpState, request: Request, body: ResponsesRequest
                           ) -> dict:
    """A Responses request rendered (vLLM's `render_responses_request`): the chat request
    the Responses route runs, under the response's id, with no parse context; stateless, so
    `previous_response_id` is refused."""
    client, _ = resolve(state, body.model)
    if body.previous_response_id is not None:
        raise HttpError(400, "previous_response_id is not supported by the stateless render "
                        "endpoint.", "invalid_request_error", "previous_response_id")
    rendered = await render_chat(state, request, to_chat_request(
        body, client.limits.max_model_len), timed=False)
    return {**rendered, "request_id": body.request_id or new_id("resp"),
            "return_token_ids": None, "parse_context": None, "stream_options": None}


async def render_completion(state: HttpState, request: Request, body: CompletionRequest
                            ) -> list[dict]:
    """Each prompt of a completions request rendered (vLLM's `render_completion_request`)."""
    rid = request_id(request, body.request_id)
    checked_id(rid)
    client, _ = resolve(state, body.model)
    _beam_search(body)
    with rendering(state, client.info.model_name, "completion"):
        ids = await prompts.completion_prompts(body, state.tokenizer, client.limits)
    reqs, _ = completions.engine_requests(body, rid, ids, client.limits)
    base = f"cmpl-{rid}"
    return [generate_request(base if len(ids) == 1 else f"{base}-{i}", p,
                             sampling_params(body, r.sampling.max_tokens, body.logprobs,
                                             body.prompt_logprobs), body)
            for i, (p, r) in enumerate(zip(ids, reqs, strict=True))]


async def generate_tokens(state: HttpState, request: Request, body: GenerateRequest
                          ) -> Response:
    """Generate from token ids (vLLM's `serve_tokens`): `generate-tokens-<id>`."""
    rid = request_id(request, body.request_id)
    try:
        checked_id(rid)
        if state.draining:
            raise draining()
        if body.features is not None or body.content_parts is not None:
            raise bad_request("multimodal inputs are not supported: doppelchip's models are "
                              "text only")
        if body.output_mode == "derender":
            raise HttpError(501, "output_mode='derender' is not served by doppelchip: decode "
                            "the token ids with /detokenize", "NotImplementedError")
        client, name = resolve(state, body.model)
        # vLLM's generate takes the session from the X-Session-ID header only
        run, ids = await start_completion(state, client,
                                          with_session(completion_body(body), request),
                                          f"generate-tokens-{rid}", rid,
                                          data_parallel_rank(request), rendered=False)
    except HttpError as e:
        return error_response(e, rid)
    shapes = GenerateShapes(body, run, f"generate-tokens-{rid}", name, state.tokenizer,
                            ids[0], int(time.time()))
    return await answer(request, run, bool(body.stream), shapes.response, shapes.chunks, [],
                        shapes.tail, rid)


def add_scale_out_routes(app: FastAPI, state: HttpState, enabled: bool) -> None:
    if not enabled:
        async def disabled() -> Response:
            return error_response(HttpError(403, DISABLED, "PermissionDeniedError"))

        for path in (*RENDER, *DERENDER, *TOKENS):
            app.add_api_route(path, disabled, methods=["POST"], include_in_schema=False)
        return

    async def rendered(request: Request, work) -> Response:
        try:
            if state.draining:
                raise draining()
            return JSONResponse(await work)
        except HttpError as e:
            return error_response(e, request.headers.get("x-request-id"))

    def render_route(model, render):
        async def route(request: Request) -> Response:
            body = await parse(request, model)
            return await rendered(request, render(state, request, body))
        return route

    for path, model, render in (
            ("/v1/chat/completions/render", ChatCompletionRequest, render_chat),
            ("/v1/messages/render", MessagesRequest,
             lambda state, request, body: render_chat(state, request, to_chat(body))),
            ("/v1/completions/render", CompletionRequest, render_completion),
            ("/v1/responses/render", ResponsesRequest, render_responses)):
        app.add_api_route(path, render_route(model, render), methods=["POST"])

    async def not_served() -> Response:
        return error_response(HttpError(501, "Derendering is not served by doppelchip: "
                                        "decode token ids with /detokenize",
                                        "NotImplementedError"))

    for path in DERENDER:
        app.add_api_route(path, not_served, methods=["POST"], include_in_schema=False)

    @app.post("/inference/v1/generate")
    async def generate_route(request: Request) -> Response:
        body = await parse(request, GenerateRequest)
        return await counted(state.load(), generate_tokens(state, request, body))

    @app.post("/inference/v1/abort_requests")
    async def abort_route(request: Request) -> Response:
        """vLLM 0.34.0: JSON whatever the Content-Type, validated as `AbortRequestsRequest`."""
        try:
            raw = await request.json()
        except ValueError as e:
            return error_response(HttpError(400, f"JSON decode error: {e}"))
        ids = validated(AbortRequestsRequest, raw).request_ids
        abort_matching(state, [ids] if isinstance(ids, str) else ids)  # (vLLM aborts in the
        return Response(status_code=200)  # background and answers at once)
