"""Prompts of HTTP requests, checked and tokenized as the gRPC path does them.

Why this exists: an HTTP prompt is tokenized here, in the front end, before the engine request
(token ids) is built, so `DeploymentClient.submit`'s prompt-size check and off-loop
tokenization never see its text. Here the text is measured against the deployment's
`max_prompt_bytes` first (400 naming the limit, before any tokenizing), and a long one is
tokenized in a thread (`Tokenizer.encode_unlocked`, as `submit` does past
`INLINE_TOKENIZE_CHARS`) so the event loop keeps serving every other stream and `/metrics`.
"""

from __future__ import annotations

import asyncio
import functools

from server.engine.errors import InvalidRequest
from server.engine.intake import Limits, check_prompt_bytes
from server.engine.tokenizer import Tokenizer
from server.frontend.deployment import INLINE_TOKENIZE_CHARS
from server.http import chat, completions, lengths
from server.http.errors import bad_request
from server.http.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest


def check_texts(texts: list[str], limits: Limits) -> None:
    try:
        for text in texts:
            check_prompt_bytes(text, limits)
    except InvalidRequest as e:
        raise bad_request(str(e), "prompt") from None


async def text_prompt(text: str, tok: Tokenizer, limits: Limits) -> list[int]:
    """One text's token ids (no special tokens)."""
    check_texts([text], limits)
    if len(text) <= INLINE_TOKENIZE_CHARS:
        return tok.encode(text)
    return await asyncio.to_thread(tok.encode_unlocked, text)


async def completion_prompts(req: CompletionRequest, tok: Tokenizer,
                             limits: Limits) -> list[list[int]]:
    """Each prompt's token ids, truncated and checked against the context as vLLM does
    (`server.http.lengths`)."""
    budget = 0 if req.echo and req.max_tokens == 0 else req.max_tokens
    lengths.check_requested(budget, "max_tokens", req.truncate_prompt_tokens,
                            limits.max_model_len)
    texts = completions.prompt_texts(req)
    check_texts(texts, limits)
    if sum(map(len, texts)) <= INLINE_TOKENIZE_CHARS:
        ids = _empty_texts_bos(req, tok, completions.prompt_ids(req, tok))
    else:
        ids = _empty_texts_bos(req, tok, await asyncio.to_thread(
            completions.prompt_ids, req, tok, tok.encode_unlocked))
    return [lengths.fit_prompt(p, limits.max_model_len, truncate=req.truncate_prompt_tokens,
                               side=req.truncation_side, from_text=text,
                               keeps_bos=text and req.add_special_tokens)
            for p, text in zip(ids, _is_text(req), strict=True)]


def _is_text(req: CompletionRequest) -> list[bool]:
    """Which of the request's prompts are text (the others token ids), in order."""
    p = req.prompt
    if isinstance(p, str):
        return [True]
    if p and all(isinstance(x, int) for x in p):
        return [False]
    return [isinstance(x, str) for x in p or ()]


def _empty_texts_bos(req: CompletionRequest, tok: Tokenizer,
                     ids: list[list[int]]) -> list[list[int]]:
    """An empty text in a prompt list is [BOS] with `add_special_tokens`, as vLLM's Hugging
    Face tokenizer makes it (`prompt_ids` starts only non-empty texts with BOS)."""
    p = req.prompt
    if not req.add_special_tokens or not isinstance(p, list) or "" not in p:
        return ids
    return [[tok.bos_token_id] if text == "" and not got else got
            for text, got in zip(p, ids, strict=True)]


async def chat_generation_prompt(req: ChatCompletionRequest, tok: Tokenizer,
                                 limits: Limits) -> list[int]:
    """A chat request's prompt, truncated and checked against the context as vLLM does
    (`server.http.lengths`; the rendered template is text: no BOS is added to keep)."""
    budget, name = req.max_completion_tokens, "max_completion_tokens"
    if budget is None:
        budget, name = req.max_tokens, "max_tokens"
    lengths.check_requested(budget, name, req.truncate_prompt_tokens, limits.max_model_len)
    ids = await chat_prompt(req.messages, tok, limits, req.add_generation_prompt,
                            req.continue_final_message)
    return lengths.fit_prompt(ids, limits.max_model_len, truncate=req.truncate_prompt_tokens,
                              side=req.truncation_side, from_text=True)


async def chat_prompt(messages: list[ChatMessage], tok: Tokenizer, limits: Limits,
                      add_generation_prompt: bool, continue_final_message: bool = False
                      ) -> list[int]:
    text = chat.message_text(messages)
    check_texts([text], limits)
    render = functools.partial(chat.render, messages, tok, add_generation_prompt,
                               continue_final_message)
    if len(text) <= INLINE_TOKENIZE_CHARS:
        return render()
    return await asyncio.to_thread(render, encode=tok.encode_unlocked)
