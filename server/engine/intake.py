"""Admission: turn an `EngineRequest` into a scheduler `Request`, or refuse it with a typed
error before anything is allocated.

Two halves, because they run in two processes:
- `check_request` (front end): tokenize and check the request against the deployment's static
  `Limits` — vocabulary, context length, KV pool size. It needs no engine state, so a front end
  answers INVALID_ARGUMENT without a round trip to a busy engine.
- `admit` (engine core process): what needs the engine's live state — the waiting-queue limit
  (RESOURCE_EXHAUSTED), a request id already in flight, and compiling the structured-output
  constraint, whose grammar state lives with the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import msgspec

from server.engine.constraints import ConstraintCompiler
from server.engine.errors import (
    AlreadyExists,
    EngineError,
    InvalidRequest,
    MaxQueuedTokens,
    Overloaded,
    QueueOverflow,
)
from server.engine.interface import EngineRequest
from server.engine.lora import LoraRegistry
from server.engine.request import Request


class Limits(msgspec.Struct, frozen=True):
    """The static admission limits of one deployment, as its engine core was built."""

    name: str
    vocab_size: int
    max_model_len: int
    num_blocks: int
    block_size: int
    max_waiting: int
    max_grammar_bytes: int
    max_grammar_depth: int = 100
    max_prompt_bytes: int = 2_000_000
    max_stop_strings: int = 256
    max_stop_bytes: int = 1024
    priority_scheduling: bool = False  # policy "priority": requests may carry a priority
    max_logprobs: int = 20  # vLLM's --max-logprobs: alternatives a request may ask (-1: all)
    holds_kv: bool = True  # False: the model keeps no KV cache (an encoder): no block to need
    # --- a pooling model (devices.ModelSpec.is_pooling): its task, vector length, Matryoshka
    pooling_task: str = ""  # "" : a generative model
    embedding_size: int = 0
    matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()  # the only ones allowed (): any
    num_labels: int = 0  # a classifier's (task "classify"; 1: a cross-encoder's score)
    use_sep_token: bool = False  # a cross-encoder tokenizes (query, document) as a pair
    # --pooler-config's request defaults and a classifier's calibration (None: unset)
    default_use_activation: bool | None = None
    default_dimensions: int | None = None
    logit_mean: float | None = None
    logit_sigma: float | None = None
    task_instructions: tuple[tuple[str, str], ...] = ()  # (input_type, its instruction)


def check_prompt_bytes(text: str, limits: Limits) -> None:
    """InvalidRequest if prompt text is over `max_prompt_bytes` (UTF-8), checked before it is
    tokenized (a text of few characters is not even encoded to count)."""
    if len(text) * 4 > limits.max_prompt_bytes \
            and (n := len(text.encode())) > limits.max_prompt_bytes:
        raise InvalidRequest(f"prompt is {n} bytes; deployment {limits.name!r} accepts at most "
                             f"{limits.max_prompt_bytes} (max_prompt_bytes)")


def check_sizes(request: EngineRequest, limits: Limits) -> None:
    """The size limits a front end checks before doing any work on a request (tokenizing a
    huge prompt, compiling many stop strings): InvalidRequest saying which."""
    if request.prompt_text is not None:
        check_prompt_bytes(request.prompt_text, limits)
    stops = request.sampling.stop
    if len(stops) > limits.max_stop_strings:
        raise InvalidRequest(f"{len(stops)} stop strings; deployment {limits.name!r} accepts at "
                             f"most {limits.max_stop_strings} (max_stop_strings)")
    longest = max((len(s.encode()) for s in stops), default=0)
    if longest > limits.max_stop_bytes:
        raise InvalidRequest(f"a stop string is {longest} bytes; deployment {limits.name!r} "
                             f"accepts at most {limits.max_stop_bytes} (max_stop_bytes)")


def prompt_ids(request: EngineRequest, vocab_size: int,
               encode: Callable[[str], list[int]]) -> list[int]:
    if request.prompt_token_ids is not None:
        ids = list(request.prompt_token_ids)
        lo, hi = (min(ids), max(ids)) if ids else (0, 0)
        if lo < 0 or hi >= vocab_size:  # vLLM's words and order (`validate_token_ids`)
            raise InvalidRequest(f"Token id {lo if lo < 0 else hi} is out of vocabulary")
    else:
        ids = encode(request.prompt_text or "")
    if not ids:
        raise InvalidRequest("prompt is empty")
    return ids


def check_task(request: EngineRequest, limits: Limits) -> None:
    """InvalidRequest when the request asks what the model does not do: a generation of a
    pooling model, pooling of a generative one (vLLM's input processor, its words)."""
    if request.pooling is None and limits.pooling_task:
        raise InvalidRequest("This model does not support generation")
    if request.pooling is not None and request.pooling.task != limits.pooling_task:
        raise InvalidRequest("This model does not support pooling" if not limits.pooling_task
                             else f"This model does not support the {request.pooling.task!r} "
                             f"pooling task")


def check_request(request: EngineRequest, limits: Limits,
                  encode: Callable[[str], list[int]]) -> tuple[list[int], int]:
    """The prompt's token ids and the resolved max_tokens, or InvalidRequest saying why not.
    A pooling request's prompt may fill the context (it generates nothing; its max_tokens,
    never reached, is 1)."""
    sp = request.sampling
    sp.validate()
    check_task(request, limits)
    if request.priority and not limits.priority_scheduling:  # as vLLM's input processor
        raise InvalidRequest(f"Got priority {request.priority} but Priority scheduling is not "
                             f"enabled (deployment {limits.name!r}: policy = \"priority\")")
    ids = prompt_ids(request, limits.vocab_size, encode)
    n, limit, name = len(ids), limits.max_model_len, limits.name
    if request.pooling is not None:
        if n > limit:
            raise InvalidRequest(f"prompt is {n} tokens; deployment {name!r} has a context of "
                                 f"{limit} tokens")
        check_blocks(n, limits)
        return ids, 1
    if n >= limit:
        raise InvalidRequest(
            f"prompt is {n} tokens; deployment {name!r} has a context of {limit} tokens"
        )
    if sp.min_tokens > limit - n:
        raise InvalidRequest(
            f"prompt ({n} tokens) + min_tokens ({sp.min_tokens}) exceeds deployment "
            f"{name!r}'s context of {limit} tokens"
        )
    max_tokens = sp.max_tokens or limit - n
    if n + max_tokens > limit:
        raise InvalidRequest(
            f"prompt ({n} tokens) + max_tokens ({max_tokens}) exceeds deployment "
            f"{name!r}'s context of {limit} tokens"
        )
    check_blocks(n + max_tokens, limits)
    return ids, max_tokens


def check_blocks(tokens: int, limits: Limits) -> None:
    """InvalidRequest when a request of `tokens` tokens at its longest needs more KV blocks
    than the deployment's whole pool (none for a model without a KV cache)."""
    if not limits.holds_kv:
        return
    need = -(-tokens // limits.block_size)
    if need > limits.num_blocks:
        raise InvalidRequest(
            f"request needs {need} KV blocks of {limits.block_size} tokens; deployment "
            f"{limits.name!r} holds {limits.num_blocks}"
        )


# vLLM 0.33.0's words for its two queue limits (vllm/exceptions.py)
QUEUE_OVERFLOW = ("The engine is currently busy and cannot accept new requests. Please try "
                  "again later or on a different instance.")
MAX_QUEUED_TOKENS = ("The engine has reached its prefill token backlog limit. Please try again "
                     "later or on a different instance.")


@dataclass(frozen=True)
class QueueLimits:
    """vLLM's queue limits (--max-num-queued-reqs, --max-num-queued-tokens; None: none, vLLM's
    default). vLLM checks them in its API server before a request reaches the engine; here the
    engine core checks them at admission, where every front end's requests are counted."""

    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None

    @property
    def active(self) -> bool:
        return self.max_num_queued_reqs is not None or self.max_num_queued_tokens is not None

    def refusal(self, unfinished: Collection[Request]) -> EngineError | None:
        """Why one more request is refused, given the deployment's `unfinished` requests
        (waiting and running), as vLLM's `check_admission`: the requests would pass the cap,
        or the prompt tokens of those without an output token yet (vLLM counts a prefilling
        request's whole prompt, chunks done or not) reach the token cap."""
        cap = self.max_num_queued_reqs
        if cap is not None and len(unfinished) + 1 > cap:
            return QueueOverflow(QUEUE_OVERFLOW)
        cap = self.max_num_queued_tokens
        if cap is not None and sum(r.num_prompt_tokens for r in unfinished
                                   if r.num_output_tokens == 0) >= cap:
            return MaxQueuedTokens(MAX_QUEUED_TOKENS)
        return None


def dp_score(load: float, waiting: float, kv_usage: float) -> float:
    """vLLM 0.33.0's score of a data-parallel rank when it balances requests over the ranks
    behind one API server (DPLBAsyncMPClient.get_core_engine_for_request), lowest first: the
    rank's `load` (running + waiting, or what the balancer routed there, whichever is more),
    and its waiting requests weigh 6 × (KV usage − 0.5) more on a rank past half full (a
    queue on a KV-bound rank drains slowly). `serve`'s front ends and the simulator's
    `vllm-dp` router both score with it."""
    if waiting:
        load += waiting * 6.0 * max(0.0, kv_usage - 0.5)
    return load


def queue_is_full(num_queued: int, free_seats: int, max_waiting: int) -> bool:
    """Whether one more request would wait beyond `max_waiting`: of the `num_queued` requests
    accepted and not running, the first `free_seats` take the batch's free seats at the next
    step, so three requests arriving together at an idle `max_num_seqs = 1, max_waiting = 2`
    deployment are all accepted, whatever the step they land in."""
    return num_queued - free_seats >= max_waiting


def admit(request: EngineRequest, ids: list[int], max_tokens: int, arrival: float, *,
          limits: Limits, num_queued: int, free_seats: int, in_flight: bool,
          constraints: ConstraintCompiler | None, lora: LoraRegistry | None = None,
          queue: QueueLimits = QueueLimits(),
          unfinished: Callable[[], Collection[Request]] = tuple) -> Request:
    """The scheduler's request, or a typed error (nothing allocated) — engine side.
    `unfinished` lists the deployment's unfinished requests, for the `queue` limits."""
    if in_flight:
        raise AlreadyExists(f"request id {request.request_id!r} is already in flight on "
                            f"deployment {limits.name!r}")
    if queue.active and (refused := queue.refusal(unfinished())) is not None:
        raise refused
    if queue_is_full(num_queued, free_seats, limits.max_waiting):
        raise Overloaded(
            f"deployment {limits.name!r}: waiting queue is full "
            f"(max_waiting={limits.max_waiting})"
        )
    constraint = None
    if request.constraint is not None and constraints is not None:
        constraint = constraints.start(request.constraint, limits.max_grammar_bytes,
                                       limits.max_grammar_depth)
    req = Request(request.request_id, ids, request.sampling.resolved(max_tokens),
                  arrival_time=arrival, priority=request.priority)
    req.pooling = request.pooling is not None
    req.constraint = constraint
    if request.lora_name:  # --- LoRA (issue 13) ---
        req.lora_id = lora_id(request.lora_name, lora, limits.name)
    req.cache_salt = request.cache_salt or None
    req.session_id = request.session_id
    req.kv_cache_report_mode = request.kv_cache_report_mode
    return req


def lora_id(name: str, lora: LoraRegistry | None, deployment: str) -> int:
    """The id of the adapter a request names, or InvalidRequest (it was unloaded meanwhile,
    or the deployment has no LoRA)."""
    adapter = lora.adapters.get(name) if lora is not None else None
    if adapter is None:
        raise InvalidRequest(f"The model `{name}` does not exist (no LoRA adapter of that name "
                             f"on deployment {deployment!r}).")
    return adapter.id
