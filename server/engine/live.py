"""The placeholder engine's per-request state, its config and its byte tokenizer."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from server.engine.interface import (
    EngineRequest,
    Finish,
    FinishReason,
    Timings,
    TokenChunk,
    Usage,
)

if TYPE_CHECKING:
    from server.engine.placeholder import _Handle

_MASK64 = (1 << 64) - 1
_ALPHABET = b"etaoin shrdlu cmfwyp vbgkjq xz etaoin "  # letter-ish frequencies, with spaces


class ByteTokenizer:
    """Placeholder tokenizer: id 0 is EOS, 1 is BOS, 2..257 are the 256 byte values."""

    eos_token_id = 0
    bos_token_id = 1
    vocab_size = 258

    def encode(self, text: str) -> list[int]:
        return [b + 2 for b in text.encode("utf-8")]

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        return bytes(i - 2 for i in ids if i >= 2).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class PlaceholderConfig:
    """One deployment as the placeholder engine runs it (describing fields are reported only)."""

    name: str
    model: str = "llama-3.1-8b"
    quant: str = "bf16"
    engine: str = "vllm"
    chip: str = "h100-sxm"
    chip_count: int = 1
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    max_model_len: int = 8192
    block_size: int = 16
    kv_blocks: int = 8192
    max_num_seqs: int = 256
    max_waiting: int = 1024
    decode_step_s: float = 0.02  # emulated seconds per step
    prefill_token_s: float = 1e-4  # emulated seconds per newly admitted prompt token
    mean_output_tokens: int = 64  # EOS is drawn with probability 1/mean per token
    time_scale: float = 1.0
    tokenizer: ByteTokenizer = field(default_factory=ByteTokenizer, compare=False)

    def __post_init__(self) -> None:
        if self.kv_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"{self.name}: {self.kv_blocks} KV blocks of {self.block_size} tokens cannot "
                f"hold one request of max_model_len={self.max_model_len}"
            )


class LiveRequest:
    """A request in flight: its tokens so far, its rolling hash and its timestamps."""

    def __init__(
        self,
        request: EngineRequest,
        prompt_ids: tuple[int, ...],
        max_tokens: int,
        handle: _Handle,
        config: PlaceholderConfig,
    ) -> None:
        self.request = request
        self.prompt_ids = prompt_ids
        self.max_tokens = max_tokens
        self.handle = handle
        self.config = config
        self.blocks_needed = -(-(len(prompt_ids) + max_tokens) // config.block_size)
        self.blocks = 0
        self.output_ids: list[int] = []
        self.arrival = self.scheduled = 0.0
        self.first_token: float | None = None
        self.last_token: float | None = None
        self._text = ""
        self._sent = 0  # characters of _text already streamed
        self._chunks = 0  # chunks built so far
        self._pending_ids: list[int] = []
        self._pending_times: list[float] = []
        self._stop_match: str | None = None
        self._stop_token: int | None = None
        seed = request.sampling.seed or 0
        digest = hashlib.blake2b(repr((seed, prompt_ids)).encode(), digest_size=8).digest()
        self._h = int.from_bytes(digest, "little")

    def _next_token(self) -> int:
        """O(1) per token: the rolling hash already folds in the whole context."""
        sp = self.request.sampling
        self._h = (self._h * 6364136223846793005 + 1442695040888963407) & _MASK64
        may_end = not sp.ignore_eos and len(self.output_ids) >= sp.min_tokens
        if may_end and (self._h >> 33) % self.config.mean_output_tokens == 0:
            return self.config.tokenizer.eos_token_id
        return _ALPHABET[(self._h >> 40) % len(_ALPHABET)] + 2

    def step(self, t: float) -> FinishReason | None:
        """Emit one token at emulated time t; return a finish reason if this token ends it."""
        sp = self.request.sampling
        if self.first_token is None:
            self.first_token = t
        self.last_token = t
        tok = self._next_token()
        self._h ^= tok
        self.output_ids.append(tok)
        self._pending_ids.append(tok)
        self._pending_times.append(t - self.arrival)
        may_stop = len(self.output_ids) > sp.min_tokens
        reason: FinishReason | None = None
        if tok == self.config.tokenizer.eos_token_id:
            reason = FinishReason.STOP
        elif may_stop and tok in sp.stop_token_ids:
            self._stop_token, reason = tok, FinishReason.STOP
        else:
            self._text += self.config.tokenizer.decode([tok])
            reason = self._match_stop_strings(len(self.config.tokenizer.decode([tok])))
        if reason is None and len(self.output_ids) >= self.max_tokens:
            reason = FinishReason.LENGTH
        if reason is None:
            self._flush(final=False)
        return reason

    def _match_stop_strings(self, delta_len: int) -> FinishReason | None:
        sp = self.request.sampling
        for s in sp.stop:
            pos = self._text.find(s, max(0, len(self._text) - delta_len - len(s) + 1))
            if pos >= 0 and len(self.output_ids) > sp.min_tokens:
                self._stop_match = s
                self._text = self._text[: pos + (len(s) if sp.include_stop_str_in_output else 0)]
                return FinishReason.STOP
        return None

    def _flush(self, final: bool) -> TokenChunk:
        """Stream pending tokens; hold back text that could still start a stop string."""
        hold = 0 if final else max((len(s) for s in self.request.sampling.stop), default=1) - 1
        upto = max(self._sent, len(self._text) - hold)
        chunk = TokenChunk(
            token_ids=tuple(self._pending_ids),
            text=self._text[self._sent : upto],
            token_times=tuple(self._pending_times) if self.request.return_token_times else (),
            index=len(self.output_ids) - len(self._pending_ids),
            prompt_token_ids=(
                self.prompt_ids
                if self.request.return_prompt_token_ids and self._chunks == 0
                else ()
            ),
        )
        self._chunks += 1
        self._sent = upto
        self._pending_ids, self._pending_times = [], []
        if not final:
            self.handle.queue.put_nowait(chunk)
        return chunk

    def final_chunk(self, reason: FinishReason, now: float) -> TokenChunk:
        chunk = self._flush(final=True)
        first = self.first_token
        last = self.last_token if self.last_token is not None else now
        scheduled = self.scheduled if self.scheduled else now
        timings = Timings(
            queue_s=max(0.0, scheduled - self.arrival),
            prefill_s=(first - scheduled) if first is not None else 0.0,
            ttft_s=(first - self.arrival) if first is not None else 0.0,
            decode_s=(last - first) if first is not None else 0.0,
            e2e_s=max(0.0, last - self.arrival),
        )
        usage = Usage(prompt_tokens=len(self.prompt_ids), completion_tokens=len(self.output_ids))
        finish = Finish(reason, usage, timings, self._stop_match, self._stop_token)
        return TokenChunk(
            chunk.token_ids, chunk.text, chunk.token_times, chunk.index,
            chunk.prompt_token_ids, finish,
        )
