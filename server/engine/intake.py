"""Admission: turn an EngineRequest into a scheduler Request, or refuse it with a typed error
before anything is allocated (the checks `Engine.submit` promises). A structured-output
constraint is compiled here, so a bad one is refused before the request is queued."""

from __future__ import annotations

from typing import TYPE_CHECKING

from server.engine.interface import EngineRequest, InvalidRequest, Overloaded
from server.engine.request import Request, SamplingParams

if TYPE_CHECKING:
    from server.engine.async_engine import AsyncEngine


def prompt_ids(request: EngineRequest, vocab_size: int, encode) -> list[int]:
    if request.prompt_token_ids is not None:
        ids = list(request.prompt_token_ids)
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidRequest(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
    else:
        ids = encode(request.prompt_text or "")
    if not ids:
        raise InvalidRequest("prompt is empty")
    return ids


def to_core_request(request: EngineRequest, engine: AsyncEngine, now: float) -> Request:
    sp = request.sampling
    sp.validate()
    if engine.is_in_flight(request.request_id):
        raise InvalidRequest(f"request id {request.request_id!r} is already in flight")
    config = engine.core.scheduler.config
    ids = prompt_ids(request, engine.tokenizer.vocab_size, engine.tokenizer.encode)
    n, limit = len(ids), config.max_model_len
    if n >= limit:
        raise InvalidRequest(
            f"prompt is {n} tokens; deployment {engine.name!r} has a context of {limit} tokens"
        )
    max_tokens = sp.max_tokens or limit - n
    if n + max_tokens > limit:
        raise InvalidRequest(
            f"prompt ({n} tokens) + max_tokens ({max_tokens}) exceeds deployment "
            f"{engine.name!r}'s context of {limit} tokens"
        )
    if engine.num_queued() >= engine.options.max_waiting:
        raise Overloaded(
            f"deployment {engine.name!r}: waiting queue is full "
            f"(max_waiting={engine.options.max_waiting})"
        )
    constraint = None
    if request.constraint is not None:  # compile (or refuse) before anything is queued
        constraint = engine.core.constraints.start(request.constraint,
                                                   engine.options.max_grammar_bytes)
    req = Request(
        request.request_id, ids,
        SamplingParams(
            max_tokens=max_tokens, ignore_eos=sp.ignore_eos, seed=sp.seed or 0,
            stop_token_ids=sp.stop_token_ids, priority=request.priority,
            min_tokens=sp.min_tokens,
        ),
        arrival_time=now,
    )
    need = engine.core.scheduler.kv.blocks_needed_alone(req)
    if need > config.num_blocks:
        raise InvalidRequest(
            f"request needs {need} KV blocks of {config.block_size} tokens; deployment "
            f"{engine.name!r} holds {config.num_blocks}"
        )
    req.constraint = constraint
    return req
