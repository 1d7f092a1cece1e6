"""The engine's vocabulary: what goes into an engine core and what comes back out of a request.

These are plain frozen `msgspec.Struct`s because they cross a process boundary: a front-end
process builds an `EngineRequest` (with its `SamplingParams` and `Constraint`) and sends it
over ZeroMQ to the deployment's engine-core process, which schedules it as a
`server.engine.request.Request`. The same classes are used in virtual time (no IPC), so there
is one name per concept on both sides. The output side (`TokenChunk`, `Finish`, `Usage`,
`Timings`) is what a front end streams for one request; `DeploymentStatus` is what
`ListDeployments` reports.

Errors: admission raises one of the typed `EngineError`s of server/engine/errors.py; the
service maps each to one gRPC status (and HTTP status).
"""

from __future__ import annotations

import enum
import json
import math
from typing import Any, Literal

import msgspec

from server.engine.errors import InvalidRequest
from server.engine.spec_metrics import RequestSpecDecodeMetrics


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


class SamplingParams(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """Sampling parameters of one request — the client's, and (after `resolved`) the
    scheduler's: one class on both sides of the IPC boundary.

    `max_tokens` None means "up to the context"; admission resolves it (and the seed) before
    the request reaches a scheduler, so the scheduler always sees an int."""

    max_tokens: int | None = None
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
    # vLLM's: a request asking its prompt's logprobs reads nothing from the prefix cache (or a
    # connector's tier): every prompt token is computed (SamplingParams.__post_init__)
    skip_reading_prefix_cache: bool = False

    def stops_at(self, token: int, num_output: int, eos: int, constrained: bool) -> bool:
        """Whether `token`, the request's `num_output`-th output token, ends it with reason
        stop: EOS that a grammar allowed always does; past `min_tokens`, EOS (unless
        `ignore_eos`) or a stop token id. The one rule of the scheduler, which ends the
        request, and of the front end's detokenizer, which must know it before the finish
        arrives to drop the stop token's text."""
        if token == eos and constrained:
            return True
        return num_output > self.min_tokens and (
            (token == eos and not self.ignore_eos) or token in self.stop_token_ids)

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
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise InvalidRequest(f"{name} must be a finite number, got {getattr(self, name)}")
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

    def resolved(self, max_tokens: int) -> SamplingParams:
        """The scheduler's view: `max_tokens` fixed (the context's room when unset) and the
        seed an int (unset: 0, so identical requests stream identical tokens)."""
        return msgspec.structs.replace(self, max_tokens=max_tokens, seed=self.seed or 0)


ConstraintKind = Literal["regex", "json_schema", "choice", "grammar"]


JSON_OBJECT = '{"type": "object"}'  # the schema of "any JSON object" (json_object constraints)


class Constraint(msgspec.Struct, frozen=True):
    """Structured output: the generated text must match this (see `constraints.py`).

    `text` is the regex, the JSON Schema document or the Lark/GBNF grammar; `choices` the
    strings of a `choice` constraint (the output is exactly one of them)."""

    kind: ConstraintKind
    text: str = ""
    choices: tuple[str, ...] = ()

    def key_text(self) -> str:
        """The constraint as one string: the cache key and what the size limit measures."""
        return json.dumps(list(self.choices)) if self.kind == "choice" else self.text


PoolingTask = Literal["embed", "classify"]


class PoolingParams(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """What a pooling request asks (vLLM's `PoolingParams`): a request that carries these
    instead of being sampled is answered with its prompt's pooled vector when its prefill ends,
    and generates no token. `dimensions` keeps the first entries of the vector (Matryoshka);
    `use_activation` normalises it (vLLM's default for `embed`). The engine reads only that the
    request pools; the front end, which has the prompt, builds the vector."""

    task: PoolingTask = "embed"
    dimensions: int | None = None
    use_activation: bool = True


class EngineRequest(msgspec.Struct, frozen=True):
    """One generation request, as a front end hands it to a deployment.

    Exactly one of `prompt_text` / `prompt_token_ids` is set by the servicer; the front end
    tokenizes before anything crosses to the engine process, which only sees token ids.
    """

    request_id: str
    prompt_text: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    sampling: SamplingParams = SamplingParams()
    priority: int = 0
    return_token_times: bool = False
    return_prompt_token_ids: bool = False
    constraint: Constraint | None = None
    # --- LoRA (issue 13) ---
    lora_name: str | None = None  # the adapter the request's `model` named (None: the base)
    # vLLM's cache_salt: the prefix cache shares blocks only between requests with the same
    # salt (and adapter): a namespace of its own, keyed into the first block's hash
    cache_salt: str | None = None
    # vLLM's session_id (the body's, else the X-Session-ID header's, else vllm_xargs'): a
    # stable id of the conversation, which the blocks it stores name in their KV events
    session_id: str | None = None
    # vLLM's extra_args["kv_cache_report_mode"] (the client's vllm_xargs): "full" reports a
    # prefix-cache hit as KV events naming the reused blocks; vLLM's default "incremental" not
    kv_cache_report_mode: str = "incremental"
    # --- P/D (issue 13): vLLM's kv_transfer_params (NIXL connector), as the client sent it
    kv_transfer_params: dict[str, Any] | None = None
    # vLLM's data_parallel_rank: the engine core (rank) a router pinned the request to
    # (HTTP `X-data-parallel-rank`, VllmEngine's field); None: the least-loaded rank
    data_parallel_rank: int | None = None
    # vLLM's return_weight_versions (always on /inference/v1/generate): the finish carries which
    # weight version sampled which output tokens
    return_weight_versions: bool = False
    # vLLM's pooling_params: set on a pooling model's requests (embeddings, scores), which end
    # with their prefill; None for generation
    pooling: PoolingParams | None = None
    # the client asked for a stream (HTTP `stream: true`): SGLang's metrics split requests by
    # it (`is_streaming`); nothing else reads it
    stream: bool = False
    # SGLang's log_metrics: False for its health probe, which the front end's request metrics
    # do not count (the engine's gauges still see it run, as SGLang's scheduler does)
    log_metrics: bool = True


class Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    jump_forward_tokens: int = 0


class Timings(msgspec.Struct, frozen=True):
    """Server-side timings of one request on the emulated timeline, in seconds.

    `delivery_lag_s`: the largest amount by which any of the request's tokens reached the wire
    after its emulated time (0 when the host kept up)."""

    queue_s: float = 0.0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    e2e_s: float = 0.0
    delivery_lag_s: float = 0.0


class Finish(msgspec.Struct, frozen=True):
    """What the last chunk of a request carries."""

    reason: FinishReason
    usage: Usage
    timings: Timings
    stop_str: str | None = None
    stop_token_id: int | None = None
    # --- P/D (issue 13): what a prefill returns for its decode side (vLLM's response field)
    kv_transfer_params: dict[str, Any] | None = None
    # vLLM's WeightVersionSpan list, (version, start, end) over output-token indexes, when the
    # request asked (EngineRequest.return_weight_versions)
    weight_versions: tuple[tuple[str, int, int], ...] | None = None
    # vLLM's --per-request-spec-decode-metrics: the request's verification steps (None: off,
    # not speculating, or not ended by the engine)
    spec_decode_metrics: RequestSpecDecodeMetrics | None = None


class TokenChunk(msgspec.Struct, frozen=True):
    """One or more tokens streamed to the client; the last chunk carries `finish`."""

    token_ids: tuple[int, ...] = ()
    text: str = ""
    token_times: tuple[float, ...] = ()  # emulated seconds since arrival, if requested
    index: int = 0  # position of token_ids[0] in the output
    prompt_token_ids: tuple[int, ...] = ()  # first chunk only, if requested
    finish: Finish | None = None


class Capacity(msgspec.Struct, frozen=True):
    kv_blocks_total: int
    kv_blocks_free: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_concurrency: int
    max_waiting: int


class LoraAdapterStatus(msgspec.Struct, frozen=True):
    """One LoRA adapter a deployment serves (ListDeployments)."""

    name: str
    id: int
    path: str
    base_model_name: str
    rank: int


class DeploymentStatus(msgspec.Struct, frozen=True):
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
    # --- LoRA (issue 13) ---
    adapters: tuple[LoraAdapterStatus, ...] = ()
