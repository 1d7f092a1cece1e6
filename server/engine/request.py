"""A request as the scheduler sees it.

One mechanism for prefill and decode (vLLM v1): a request knows its token ids (prompt followed
by the outputs sampled so far) and how many of them have KV computed (``num_computed_tokens``).
Each step the scheduler lets ``num_computed_tokens`` catch up with ``num_tokens`` by some
number of new tokens: many (a prefill chunk, or a recompute after preemption) or exactly one
(a decode). When a step brings ``num_computed_tokens`` up to ``num_tokens`` the model samples
the next token, which makes ``num_tokens`` one larger again.

Lifecycle::

    WAITING ──▶ RUNNING ──▶ FINISHED_{STOPPED,LENGTH,ABORTED,ERROR}
                  │  ▲
                  ▼  │ (re-admitted from the front of the waiting queue)
               PREEMPTED          (its KV freed; recomputed on re-admission)
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .interface import FinishReason, SamplingParams  # shared with the service
from .prefix_cache import Namespace
from .spec_metrics import RequestSpecDecodeMetrics


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2  # waiting again, at the front of the queue, KV freed
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_ABORTED = 5
    FINISHED_ERROR = 6
    WAITING_FOR_REMOTE_KVS = 7  # its prefix is loading from the CPU tier (kv_offload.py)

    @property
    def is_finished(self) -> bool:
        return RequestStatus.FINISHED_STOPPED <= self <= RequestStatus.FINISHED_ERROR

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASONS.get(self)

    @staticmethod
    def for_reason(reason: FinishReason) -> RequestStatus:
        return _STATUS_FOR_REASON[reason]


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}
_STATUS_FOR_REASON = {reason: status for status, reason in _FINISH_REASONS.items()}


class Request:
    """A generation request: its tokens, its progress, its KV block table, its status.

    Written only by the scheduler (and the KV manager it owns); the engine loop and the mock
    model read it. ``num_cached_tokens`` is the prompt prefix served from the prefix cache at
    the request's *first* admission (what the response's usage reports); -1 until admitted.
    ``constraint`` is the request's grammar state (``constraints.ConstraintState``) or None;
    ``num_jump_forward_tokens`` counts output tokens the grammar forced and the engine appended
    without a decode step (jump-forward).
    """

    __slots__ = (
        "_hash_len",
        "_hash_value",
        "_lag_len",
        "_lag_value",
        "_tree_len",
        "arrival_time",
        "block_ids",
        "cache_node",
        "cache_salt",
        "constraint",
        "finish_reason",
        "hold_kv",
        "kv_cache_report_mode",
        "lora_id",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_external_tokens",
        "num_jump_forward_tokens",
        "num_preemptions",
        "num_prompt_tokens",
        "num_remote_tokens",
        "pooling",
        "priority",
        "request_id",
        "sampling_params",
        "session_id",
        "spec_decode_metrics",
        "status",
        "token_ids",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams | None = None,
        arrival_time: float = 0.0,
        priority: int = 0,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("a request needs at least one prompt token")
        sp = sampling_params or SamplingParams(max_tokens=16)
        if sp.max_tokens is None or sp.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {sp.max_tokens}")
        if not 0 <= sp.min_tokens <= sp.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens], got {sp.min_tokens}")
        if sp.seed is None:
            sp = sp.resolved(sp.max_tokens)
        self.request_id = request_id
        self.sampling_params = sp  # resolved: max_tokens and seed are ints
        self.priority = priority  # lower values are served first (vLLM's rule)
        self.arrival_time = arrival_time
        self.token_ids: list[int] = list(prompt_token_ids)  # prompt, then outputs
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.block_ids: list[int] = []  # block table: block i holds tokens [i*bs, (i+1)*bs)
        self.cache_node: Any = None  # the radix node this request holds locked, if any
        self.constraint: Any = None  # ConstraintState of a structured-output request
        self.num_jump_forward_tokens = 0
        # vLLM's --per-request-spec-decode-metrics: its verification steps (spec_metrics.py),
        # set by the engine core when the deployment reports them
        self.spec_decode_metrics: RequestSpecDecodeMetrics | None = None
        self.lora_id = 0  # the LoRA adapter it runs with (0: the base model; server/engine/lora.py)
        self.cache_salt: str | None = None  # vLLM's cache_salt (see cache_ns)
        # vLLM's session_id (the body's, the X-Session-ID header's): named by its KV events
        self.session_id: str | None = None
        # vLLM's extra_args["kv_cache_report_mode"]: "full" has a prefix-cache hit reported
        # as KV events (`KvEventLog.reused`); anything else is vLLM's "incremental"
        self.kv_cache_report_mode = "incremental"
        self._tree_len = 0  # tokens of this request known to be in the prefix cache
        # --- P/D (issue 13): vLLM's NIXL connector, emulated (server/engine_proc/kv_connector)
        self.num_external_tokens = 0  # decode side: prompt tokens whose KV its pull brought
        self.num_remote_tokens = 0  # decode side: prompt tokens a prefill pod holds, to be
        #                             pulled when the request is admitted (kv_pulls.py)
        self.hold_kv = False  # prefill side: keep the KV for the decode side when length-capped
        # a pooling model's request (embeddings): it ends, stopped, in the step that completes
        # its prefill, and samples nothing (vLLM's pooling_params)
        self.pooling = False
        # Mock-model state: a rolling hash of token_ids[:_hash_len] (see mock_model.py).
        self._hash_len = 0
        self._hash_value = 0
        # ... and of token_ids[:_lag_len], the context but its last LAG tokens (free decodes)
        self._lag_len = 0
        self._lag_value = 0

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def cache_ns(self) -> Namespace:
        """Its prefix-cache namespace: the adapter's id, or (id, cache_salt) for a salted
        request (vLLM's cache_salt: blocks are shared only within a namespace)."""
        return self.lora_id if self.cache_salt is None else (self.lora_id, self.cache_salt)

    @contextmanager
    def lookahead(self, tokens: Sequence[int]) -> Iterator[Request]:
        """This request with ``tokens`` appended for the duration (speculative decoding asks the
        model what it would generate after accepted drafts); afterwards the token ids are as
        before and the mock model's hash state is restored, so nothing is recomputed."""
        n, hash_len, hash_value = len(self.token_ids), self._hash_len, self._hash_value
        lag = self._lag_len, self._lag_value
        self.token_ids.extend(tokens)
        try:
            yield self
        finally:
            del self.token_ids[n:]
            self._hash_len, self._hash_value = hash_len, hash_value
            self._lag_len, self._lag_value = lag

    def stop_reason(self, token: int, eos_token_id: int | None, max_model_len: int
                    ) -> FinishReason | None:
        """Why the request ends with `token` just appended (STOP: EOS or a stop token; LENGTH:
        max_tokens or the context), or None if it goes on."""
        sp = self.sampling_params
        if sp.stops_at(token, self.num_output_tokens, eos_token_id, self.constraint is not None):
            return FinishReason.STOP
        if self.num_output_tokens >= sp.max_tokens or self.num_tokens >= max_model_len:
            return FinishReason.LENGTH
        return None

    def max_len(self, max_model_len: int) -> int:
        """The most tokens this request can ever hold (what a contiguous layout reserves; a
        pooling request's prompt, which may fill the context)."""
        if self.pooling:
            return self.num_prompt_tokens
        return min(self.num_prompt_tokens + self.sampling_params.max_tokens, max_model_len)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, prompt={self.num_prompt_tokens}, "
            f"out={self.num_output_tokens}, computed={self.num_computed_tokens}, "
            f"blocks={len(self.block_ids)})"
        )

