"""One of a request's n outputs as an engine gRPC service streams it (SGLang's
`SglangScheduler`, TensorRT-LLM's `TrtllmService`, MLX's `MlxEngine`): its ids so far, the
cumulative counts every chunk and its final message carry, and its emulated logprobs when
asked.

Why a module of its own: the services stream the same three things per output and differ only
in the message shapes they build from them (`server/sglang_convert.py`,
`server/trtllm_convert.py`, `server/mlx_convert.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from server.engine.interface import FinishReason, TokenChunk
from server.frontend.logprobs import Logprobs
from server.frontend.stream import RequestStream


class Counts(msgspec.Struct):
    """One output's cumulative counts, as every chunk and its final message carry them."""

    prompt_tokens: int
    completion_tokens: int = 0
    cached_tokens: int = 0


class Output:
    """One output as it streams: its ids so far, counts, logprobs (`logprobs` None: not
    asked)."""

    def __init__(self, stream: RequestStream, logprobs: Logprobs | None) -> None:
        self.stream, self.lp = stream, logprobs
        self.ids: list[int] = []
        self.counts = Counts(prompt_tokens=len(stream.out.prompt_ids))
        self.tops: list[list[tuple[int, float]]] = []

    def add(self, ids: Sequence[int], k: int) -> list[list[tuple[int, float]]]:
        """Take a chunk's ids; their top logprobs, `max(1, k)` per position (none unless
        asked)."""
        start = len(self.ids)
        self.ids.extend(ids)
        self.counts.completion_tokens = len(self.ids)
        self.counts.cached_tokens = self.stream.cached
        if self.lp is None:
            return []
        new = [self.lp.top(start + i, t, max(1, k)) for i, t in enumerate(ids)]
        self.tops += new
        return new


def finish_fields(chunk: TokenChunk, eos: int | None, aborted: str) -> dict:
    """A final message's finish fields (`finish_reason`, and `matched_stop_str` or
    `matched_token_id` for a stop), named alike in both protos: a stop string or stop token id
    that matched; the end of sequence as a match of `eos` (SGLang's FINISH_MATCHED_TOKEN), or
    as no match with `eos` None (TensorRT-LLM's END_ID); `aborted`: the reason an aborted or
    failed request ends with."""
    f = chunk.finish
    assert f is not None
    if f.reason is FinishReason.LENGTH:
        return {"finish_reason": "length"}
    if f.reason is FinishReason.STOP:
        if f.stop_str is not None:
            return {"finish_reason": "stop", "matched_stop_str": f.stop_str}
        token = f.stop_token_id if f.stop_token_id is not None else eos
        return {"finish_reason": "stop"} if token is None else {
            "finish_reason": "stop", "matched_token_id": token}
    return {"finish_reason": aborted}
