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

from server.engine.intake import Limits, check_prompt_bytes
from server.engine.interface import InvalidRequest
from server.engine.tokenizer import Tokenizer
from server.frontend.deployment import INLINE_TOKENIZE_CHARS
from server.http import chat, completions
from server.http.errors import bad_request
from server.http.protocol import ChatMessage, CompletionRequest


def _check(texts: list[str], limits: Limits) -> None:
    try:
        for text in texts:
            check_prompt_bytes(text, limits)
    except InvalidRequest as e:
        raise bad_request(str(e), "prompt") from None


async def text_prompt(text: str, tok: Tokenizer, limits: Limits) -> list[int]:
    """One text's token ids (no special tokens)."""
    _check([text], limits)
    if len(text) <= INLINE_TOKENIZE_CHARS:
        return tok.encode(text)
    return await asyncio.to_thread(tok.encode_unlocked, text)


async def completion_prompts(req: CompletionRequest, tok: Tokenizer,
                             limits: Limits) -> list[list[int]]:
    texts = completions.prompt_texts(req)
    _check(texts, limits)
    if sum(map(len, texts)) <= INLINE_TOKENIZE_CHARS:
        return completions.prompt_ids(req, tok)
    return await asyncio.to_thread(completions.prompt_ids, req, tok, tok.encode_unlocked)


async def chat_prompt(messages: list[ChatMessage], tok: Tokenizer, limits: Limits,
                      add_generation_prompt: bool, continue_final_message: bool = False
                      ) -> list[int]:
    text = chat.message_text(messages)
    _check([text], limits)
    render = functools.partial(chat.render, messages, tok, add_generation_prompt,
                               continue_final_message)
    if len(text) <= INLINE_TOKENIZE_CHARS:
        return render()
    return await asyncio.to_thread(render, encode=tok.encode_unlocked)
