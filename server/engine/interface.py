"""The engine's interface: what the service layer hands in and what streams back.

Every engine (the placeholder now, the scheduler-driven engine later) implements `Engine`. The
boundary objects are plain frozen data so the service layer can convert them to and from the
wire without knowing anything about scheduling, and so tests can build them by hand.

Contract:
- `submit(request)` validates the request against the deployment and either raises a typed
  `EngineError` (nothing was allocated) or returns a `RequestHandle` at once; it never blocks.
- `handle.outputs()` yields `TokenChunk`s in order; exactly the last one carries `finish`.
- `abort(request_id)` may be called at any time, for any id, any number of times; the engine
  loop frees the request's KV blocks and queue entry on its next turn.
- Only the engine's own loop task mutates its state (one writer).
"""

from __future__ import annotations

import enum
import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal


class EngineError(Exception):
    """Base of the errors `submit` raises; each maps to one gRPC status in the service."""


class InvalidRequest(EngineError):
    """The request itself is wrong (INVALID_ARGUMENT)."""


class Overloaded(EngineError):
    """Admission control refused the request (RESOURCE_EXHAUSTED)."""


class Unavailable(EngineError):
    """The deployment is compiling or draining (UNAVAILABLE)."""


class NotPlaced(EngineError):
    """The deployment could not be placed on its device (FAILED_PRECONDITION)."""


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


class DeploymentState(enum.StrEnum):
    COMPILING = "compiling"
    READY = "ready"
    FAILED = "failed"
    DRAINING = "draining"


@dataclass(frozen=True)
class SamplingOptions:
    """Sampling parameters as the engine sees them (already range-checked by `validate`)."""

    max_tokens: int | None = None  # None: up to the context length
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def validate(self) -> None:
        """Raise InvalidRequest naming the first out-of-range option."""
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise InvalidRequest(f"max_tokens must be > 0, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise InvalidRequest(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidRequest(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        if self.temperature < 0:
            raise InvalidRequest(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise InvalidRequest(f"top_k must be -1 (off) or >= 0, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise InvalidRequest(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise InvalidRequest(
                f"repetition_penalty must be > 0, got {self.repetition_penalty}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2 <= value <= 2:
                raise InvalidRequest(f"{name} must be in [-2, 2], got {value}")
        if any(s == "" for s in self.stop):
            raise InvalidRequest("stop strings must not be empty")


ConstraintKind = Literal["regex", "json_schema", "choice", "grammar"]


@dataclass(frozen=True)
class Constraint:
    """Structured output: the generated text must match this (see `constraints.py`).

    `text` is the regex, the JSON Schema document or the Lark/GBNF grammar; `choices` the
    strings of a `choice` constraint (the output is exactly one of them)."""

    kind: ConstraintKind
    text: str = ""
    choices: tuple[str, ...] = ()

    def key_text(self) -> str:
        """The constraint as one string: the cache key and what the size limit measures."""
        return json.dumps(list(self.choices)) if self.kind == "choice" else self.text


@dataclass(frozen=True)
class EngineRequest:
    """One generation request, as the service hands it to `Engine.submit`.

    Exactly one of `prompt_text` / `prompt_token_ids` is set.
    """

    request_id: str
    prompt_text: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    priority: int = 0
    return_token_times: bool = False
    return_prompt_token_ids: bool = False
    constraint: Constraint | None = None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    jump_forward_tokens: int = 0


@dataclass(frozen=True)
class Timings:
    """Server-side timings of one request on the emulated timeline, in seconds."""

    queue_s: float = 0.0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    e2e_s: float = 0.0


@dataclass(frozen=True)
class Finish:
    """What the last chunk of a request carries."""

    reason: FinishReason
    usage: Usage
    timings: Timings
    stop_str: str | None = None
    stop_token_id: int | None = None


@dataclass(frozen=True)
class TokenChunk:
    """One or more tokens streamed to the client; the last chunk carries `finish`."""

    token_ids: tuple[int, ...] = ()
    text: str = ""
    token_times: tuple[float, ...] = ()  # emulated seconds since arrival, if requested
    index: int = 0  # position of token_ids[0] in the output
    prompt_token_ids: tuple[int, ...] = ()  # first chunk only, if requested
    finish: Finish | None = None

    def merge(self, later: TokenChunk) -> TokenChunk:
        """This chunk followed by `later`, as one chunk (a slow consumer gets fewer messages)."""
        return TokenChunk(
            token_ids=self.token_ids + later.token_ids,
            text=self.text + later.text,
            token_times=self.token_times + later.token_times,
            index=self.index,
            prompt_token_ids=self.prompt_token_ids or later.prompt_token_ids,
            finish=later.finish,
        )


@dataclass(frozen=True)
class Capacity:
    kv_blocks_total: int
    kv_blocks_free: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_concurrency: int
    max_waiting: int


@dataclass(frozen=True)
class DeploymentStatus:
    """What `ListDeployments` reports about one deployment."""

    name: str
    model: str
    quant: str
    engine: str
    chip: str
    chip_count: int
    tensor_parallel: int
    pipeline_parallel: int
    state: DeploymentState
    state_message: str
    capacity: Capacity
    num_running: int
    num_waiting: int


@dataclass
class EngineStats:
    """Cumulative counters the engine loop updates and the metrics collector reads."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    jump_forward_tokens: int = 0  # of generation_tokens, forced by a grammar and not decoded
    finished: dict[str, int] = field(default_factory=dict)  # finish reason -> count
    aborted_request_ids: list[str] = field(default_factory=list)  # most recent last, bounded

    def record_finish(self, request_id: str, reason: FinishReason) -> None:
        self.finished[reason.value] = self.finished.get(reason.value, 0) + 1
        if reason is FinishReason.ABORT:
            self.aborted_request_ids.append(request_id)
            del self.aborted_request_ids[:-1000]


class RequestHandle(ABC):
    """The caller's side of one submitted request."""

    request_id: str
    prompt_token_ids: tuple[int, ...]

    @abstractmethod
    def outputs(self) -> AsyncIterator[TokenChunk]:
        """Chunks in order; ends after the chunk that carries `finish`."""


class Engine(ABC):
    """One deployment's engine: a loop task that owns the scheduler and KV state."""

    name: str
    stats: EngineStats

    @abstractmethod
    async def start(self) -> None:
        """Start the engine loop (and, for a cold deployment, its build)."""

    @abstractmethod
    async def stop(self) -> None:
        """Abort everything in flight, release it, and end the loop task."""

    @abstractmethod
    def submit(self, request: EngineRequest) -> RequestHandle:
        """Validate and enqueue; raise an EngineError subclass (nothing allocated) on refusal."""

    @abstractmethod
    def abort(self, request_id: str) -> None:
        """Ask the loop to end this request (finish reason abort) and free its resources."""

    @abstractmethod
    def status(self) -> DeploymentStatus:
        """A snapshot for ListDeployments / GetDeployment and the metrics collector."""

    @abstractmethod
    def num_unfinished(self) -> int:
        """Requests submitted and not yet finished (waiting + running)."""

    @abstractmethod
    async def until_idle(self) -> None:
        """Return once no request is in flight and every KV block is released."""
