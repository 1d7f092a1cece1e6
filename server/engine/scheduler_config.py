"""Plain data around the scheduler: its configuration, its per-step output, its counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from .request import Request

Policy = Literal["fcfs", "priority", "lpm"]
KVLayout = Literal["paged", "contiguous"]
Batching = Literal["continuous", "static"]


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """How one deployment schedules. Defaults follow vLLM v1 (block 16, 256 sequences, an
    8192-token step budget, chunked prefill and prefix caching on, FCFS).

    Baselines: ``enable_prefix_caching=False`` (no radix cache), ``kv_layout="contiguous"``
    (each request reserves ceil(max_len / block_size) blocks at admission, pre-vLLM),
    ``batching="static"`` (a batch is admitted only when nothing runs, and runs until all of
    its requests end). ``lpm_fcfs_threshold``: the longest-prefix-match policy falls back to
    FCFS when more requests than this wait (SGLang uses 128). ``num_speculative_tokens`` > 0:
    every decode also verifies that many draft tokens (speculative decoding; a tree's width,
    ``SpeculativeConfig.drafts_per_step``): they take KV slots (lookahead) and token budget,
    as in vLLM. ``long_prefill_token_threshold`` > 0
    (vLLM's flag; 0 off, its default): while more than one request is running or waiting, no
    request gets more than that many tokens a step, so a long prefill cannot take the whole
    budget from the others; with ``long_prefill_token_threshold_adaptive`` the cap is at least
    the budget's fair share (budget / requests), as vLLM's scheduler; only with chunked prefill
    (vLLM 0.34.0: a whole prompt is never cut). ``max_num_inflight_kv_loads`` (vLLM 0.34.0's
    flag; None, its default, keeps 0.33.0's scheduling): at most that many requests hold
    blocks for an async KV load (a P/D pull or a CPU-tier load in flight, or landed and not
    yet running), and P/D pulls may start while every seat is taken
    (``Scheduler._start_pulls``). ``cache_aware_admission_window`` N > 0 (vLLM 0.34.0; FCFS
    with prefix caching only): while the KV usage is at least
    ``cache_aware_admission_threshold``, the plain waiting requests among the first N are
    admitted deepest cached prefix first (``policy.cache_aware_reorder``).
    ``kv_cache=False``: the model keeps no KV cache (an encoder): nothing is allocated, and
    the pool is one null block (``kv_manager.NoKVCacheManager``).
    """

    num_blocks: int = 1024
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    enable_chunked_prefill: bool = True
    policy: Policy = "fcfs"
    enable_prefix_caching: bool = True
    kv_cache: bool = True
    kv_layout: KVLayout = "paged"
    batching: Batching = "continuous"
    lpm_fcfs_threshold: int = 128
    num_speculative_tokens: int = 0
    # --- LoRA (issue 13) ---
    max_loras: int = 0  # distinct LoRA adapters one step may run (0: LoRA off)
    long_prefill_token_threshold: int = 0
    long_prefill_token_threshold_adaptive: bool = False
    max_num_inflight_kv_loads: int | None = None
    cache_aware_admission_window: int = 0
    cache_aware_admission_threshold: float = 0.5

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
                     "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0, got "
                             f"{self.long_prefill_token_threshold}")
        if self.max_num_inflight_kv_loads is not None and self.max_num_inflight_kv_loads < 1:
            raise ValueError("max_num_inflight_kv_loads must be >= 1, got "
                             f"{self.max_num_inflight_kv_loads}")
        if self.cache_aware_admission_window < 0:
            raise ValueError("cache_aware_admission_window must be >= 0, got "
                             f"{self.cache_aware_admission_window}")
        if not 0.0 <= self.cache_aware_admission_threshold <= 1.0:
            raise ValueError("cache_aware_admission_threshold must be in [0, 1], got "
                             f"{self.cache_aware_admission_threshold}")
        if self.policy not in ("fcfs", "priority", "lpm"):
            raise ValueError(f"unknown policy {self.policy!r} (fcfs, priority or lpm)")
        if self.kv_layout not in ("paged", "contiguous"):
            raise ValueError(f"unknown kv_layout {self.kv_layout!r} (paged or contiguous)")
        if self.batching not in ("continuous", "static"):
            raise ValueError(f"unknown batching {self.batching!r} (continuous or static)")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(  # vLLM 0.33.0's SchedulerConfig.verify_max_model_len
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({self.max_model_len}). This effectively limits the maximum "
                "sequence length to max_num_batched_tokens and makes vLLM reject longer "
                "sequences. Please increase max_num_batched_tokens or decrease max_model_len.")


def long_prefill_cap(cfg: SchedulerConfig, eligible: int, budget: int) -> int:
    """A step's cap on one request's new tokens (the whole `budget`: none): vLLM's
    long_prefill_token_threshold, off while one request alone runs or waits (nobody to
    starve) and without chunked prefill, floored at the budget's fair share when adaptive."""
    if not cfg.long_prefill_token_threshold or eligible <= 1 or not cfg.enable_chunked_prefill:
        return budget
    if cfg.long_prefill_token_threshold_adaptive:
        return max(cfg.long_prefill_token_threshold, budget // eligible)
    return cfg.long_prefill_token_threshold


class ScheduledRequest(NamedTuple):
    """One request's share of a step: compute KV for tokens
    ``[start_position, start_position + num_new_tokens)`` of its token ids. (A NamedTuple:
    one is made per request per step, and a tuple is the cheapest immutable record.)"""

    request_id: str
    num_new_tokens: int
    start_position: int  # == tokens already computed (cached prefix included)
    is_prefill: bool  # False only for a one-token decode of an output token
    samples_token: bool  # the chunk reaches the last known token, so the model samples one
    num_draft_tokens: int = 0  # speculative decoding: draft tokens verified with this decode



# ScheduledRequest(...) without the NamedTuple's Python-level __new__ (one per request per
# step): the fields in order, num_draft_tokens included
_new = tuple.__new__


def is_decode(req: Request, num_new: int) -> bool:
    """Whether `num_new` tokens from the request's computed ones are a decode of its last
    output token (not a prefill chunk)."""
    start = req.num_computed_tokens
    return num_new == 1 and start == req.num_tokens - 1 and start >= req.num_prompt_tokens


def draft_tokens(config: SchedulerConfig, req: Request, num_new: int, budget: int) -> int:
    """Draft tokens a decode verifies this step (speculative decoding), if the budget has
    room: none for a prefill chunk, a constrained request, or at the context's end."""
    k = min(config.num_speculative_tokens, config.max_model_len - req.num_tokens)
    if k < 1 or req.constraint is not None or not is_decode(req, num_new):
        return 0
    return k if budget >= num_new + k else 0


def scheduled_entry(req: Request, num_new: int, drafts: int = 0) -> ScheduledRequest:
    """The request's entry in this step's output: `num_new` tokens from its computed ones (a
    pooling request's last chunk samples nothing: its pooled vector is its answer)."""
    start, n = req.num_computed_tokens, len(req.token_ids)
    decode = num_new == 1 and start == n - 1 and start >= req.num_prompt_tokens
    return _new(ScheduledRequest, (req.request_id, num_new, start, not decode,
                                   start + num_new == n and not req.pooling, drafts))

@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """What one ``Scheduler.schedule()`` decided, as plain immutable data.

    Why it exists: it is the only thing that crosses from the scheduler to the rest of the
    step. The device cost model turns it into a batch shape (``prefill_segments`` and
    ``decode_context_lengths``), the mock model reads it to know which requests sample, and
    ``Scheduler.update`` takes it back with the sampled tokens. Nobody downstream touches
    scheduler or KV state, so a step can be logged, compared in tests, or run elsewhere.
    """

    scheduled: tuple[ScheduledRequest, ...] = ()
    preempted_request_ids: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def prefill_segments(self) -> list[tuple[int, int]]:
        """``(num_tokens, start_position)`` per prefill chunk."""
        return [(s.num_new_tokens, s.start_position) for s in self.scheduled if s.is_prefill]

    @property
    def decode_context_lengths(self) -> list[int]:
        """Context length (tokens attended over, the new one included) per decode."""
        return [s.start_position + 1 for s in self.scheduled if not s.is_prefill]

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled if s.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(1 for s in self.scheduled if not s.is_prefill)


@dataclass(slots=True)
class SchedulerStats:
    """Monotone counters since start (prefix-cache counts in tokens, as vLLM's metrics)."""

    num_steps: int = 0  # steps that scheduled something
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up at admission
    prefix_cache_hits: int = 0  # of those, tokens served from the cache
    # --- P/D (issue 13): vLLM's external (KV connector) prefix-cache counters ---
    external_prefix_cache_queries: int = 0
    external_prefix_cache_hits: int = 0  # prompt tokens whose KV a remote prefill sent
    host_prefix_cache_hits: int = 0  # of those, loaded from the CPU tier (kv_offload.py)
    num_prefill_tokens: int = 0  # tokens prefilled (recompute after preemption included)
    num_generation_tokens: int = 0
    num_jump_forward_tokens: int = 0  # of those, appended by jump-forward without a decode
    num_finished: int = 0
    num_aborted: int = 0
    peak_num_running: int = 0
    # --- LoRA (issue 13) ---
    num_lora_deferred: int = 0  # a gauge: waiting requests the last step skipped for max_loras

    @property
    def prefix_cache_hit_rate(self) -> float:
        queries = self.prefix_cache_queries
        return self.prefix_cache_hits / queries if queries else 0.0
