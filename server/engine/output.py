"""The output side of one request: text deltas, stop strings, timestamps, the final chunk.

vLLM's output processor in miniature. The engine loop feeds it each step's new tokens with
the step's emulated end time; it returns the `TokenChunk` to stream. Text that could still be
the start of a stop string is held back until it cannot, so a client never sees text that a
stop string later takes back. Synchronous and clock-free: it only records the times it is told.
Several tokens from one step (jump-forward) share the step's interval (`spread_times`).
"""

from __future__ import annotations

from server.engine.interface import (
    EngineRequest,
    Finish,
    FinishReason,
    Timings,
    TokenChunk,
    Usage,
)
from server.engine.tokenizer import Tokenizer


def spread_times(prev: float | None, t: float, n: int) -> list[float]:
    """Times of `n` tokens that one step ending at `t` produced (a sampled token and the
    tokens jump-forward appended after it). As SGLang records inter-token latency, the interval
    since the previous token (`prev`) is divided evenly over them; the first tokens of a
    request have no previous interval and all arrive at `t`."""
    if prev is None or n <= 1:
        return [t] * n
    return [prev + (t - prev) * (i + 1) / n for i in range(n)]


class RequestOutput:
    def __init__(
        self,
        request: EngineRequest,
        prompt_ids: tuple[int, ...],
        tokenizer: Tokenizer,
        arrival: float,
    ) -> None:
        self.request = request
        self.prompt_ids = prompt_ids
        self.arrival = arrival
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.num_tokens = 0
        self.stop_str: str | None = None
        self._detok = tokenizer.detokenizer()
        self._special = tokenizer.special_token_ids
        self._stops = request.sampling.stop
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._text = ""
        self._sent = 0  # characters of _text already streamed
        self._chunks = 0
        self._stopped = False

    def scheduled(self, t: float) -> None:
        if self.first_scheduled is None:
            self.first_scheduled = t

    def add(self, token_ids: list[int], t: float) -> TokenChunk | None:
        """Tokens produced by a step ending at emulated time `t`; None if nothing to send.

        After a stop string matched (`stopped`), the engine finishes the request; later tokens
        are not streamed."""
        if self._stopped or not token_ids:
            return None
        if self.first_token is None:
            self.first_token = t
        prev, self.last_token = self.last_token, t
        index = self.num_tokens
        self.num_tokens += len(token_ids)
        if self._skip_text(token_ids[-1]):
            self._text += self._detok.push_many(token_ids[:-1])
        else:
            self._text += self._detok.push_many(token_ids)
        self._match_stop(len(token_ids))
        hold = 0 if self._stopped else self._hold
        upto = max(self._sent, len(self._text) - hold)
        times = tuple(x - self.arrival for x in spread_times(prev, t, len(token_ids))) \
            if self.request.return_token_times else ()
        chunk = TokenChunk(
            token_ids=tuple(token_ids), text=self._text[self._sent : upto], token_times=times,
            index=index, prompt_token_ids=self._prompt_once(),
        )
        self._sent = upto
        return chunk

    def _skip_text(self, token: int) -> bool:
        """Stop tokens (EOS, stop_token_ids) end the request without adding text."""
        return token in self._special or token in self.request.sampling.stop_token_ids

    def _prompt_once(self) -> tuple[int, ...]:
        self._chunks += 1
        if self._chunks == 1 and self.request.return_prompt_token_ids:
            return self.prompt_ids
        return ()

    def _match_stop(self, new_tokens: int) -> None:
        if not self._stops or self.num_tokens <= self.request.sampling.min_tokens:
            return
        start = max(0, self._sent - self._hold - 1)
        best: tuple[int, str] | None = None
        for s in self._stops:
            pos = self._text.find(s, start)
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, s)
        if best is not None:
            pos, s = best
            keep = len(s) if self.request.sampling.include_stop_str_in_output else 0
            self._text = self._text[: pos + keep]
            self._sent = min(self._sent, len(self._text))
            self.stop_str, self._stopped = s, True

    @property
    def stopped(self) -> bool:
        """A stop string matched: the engine must finish the request with reason stop."""
        return self._stopped

    def final(
        self, reason: FinishReason, now: float, cached: int = 0, stop_token: int | None = None,
        jump_forward: int = 0,
    ) -> TokenChunk:
        """The last chunk: the rest of the text, finish reason, usage and timings."""
        if not self._stopped:
            self._text += self._detok.flush()
        text = self._text[self._sent :]
        self._sent = len(self._text)
        first, last = self.first_token, self.last_token if self.last_token is not None else now
        scheduled = self.first_scheduled if self.first_scheduled is not None else now
        timings = Timings(
            queue_s=max(0.0, scheduled - self.arrival),
            prefill_s=(first - scheduled) if first is not None else 0.0,
            ttft_s=(first - self.arrival) if first is not None else 0.0,
            decode_s=(last - first) if first is not None else 0.0,
            e2e_s=max(0.0, last - self.arrival),
        )
        usage = Usage(len(self.prompt_ids), cached, self.num_tokens, jump_forward)
        return TokenChunk(
            text=text, index=self.num_tokens, prompt_token_ids=self._prompt_once(),
            finish=Finish(reason, usage, timings, self.stop_str, stop_token),
        )
