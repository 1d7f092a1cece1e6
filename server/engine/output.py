"""The output side of one request: text deltas, stop strings, token times, timings.

vLLM's output processor in miniature, used by the front end that streams the request.
`RequestOutput.add(token_ids)` turns new tokens into the text to send now: text that could
still be the start of a stop string is held back until it cannot, so a client never sees text
that a stop string later takes back. Several tokens of one step (jump-forward, or a consumer
that fell behind) share the step's interval (`spread_times`). Synchronous and clock-free: it
only records what it is told.
"""

from __future__ import annotations

from server.engine.interface import EngineRequest, Timings
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
    """Detokenization and stop strings of one request (the text it streams)."""

    __slots__ = ("_detok", "_hold", "_min_tokens", "_prompt_sent", "_sent", "_special",
                 "_stop_ids", "_stops", "_text", "include_stop", "num_tokens", "prompt_ids",
                 "request", "stop_str", "stopped")

    def __init__(self, request: EngineRequest, prompt_ids: tuple[int, ...],
                 tokenizer: Tokenizer) -> None:
        self.request = request
        self.prompt_ids = prompt_ids
        self.num_tokens = 0
        self.stop_str: str | None = None
        self.stopped = False  # a stop string matched: the request ends with reason stop
        self._detok = tokenizer.detokenizer()
        self._special = tokenizer.special_token_ids
        sp = request.sampling
        self._stops = sp.stop
        self._stop_ids = frozenset(sp.stop_token_ids)
        self._min_tokens = sp.min_tokens
        self.include_stop = sp.include_stop_str_in_output
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._text = ""
        self._sent = 0  # characters of _text already streamed
        self._prompt_sent = False

    @property
    def has_stops(self) -> bool:
        return bool(self._stops)

    def add(self, token_ids: list[int]) -> str:
        """The text to stream for these new tokens ("" while held back). After a stop string
        matched (`stopped`), later tokens add nothing."""
        if self.stopped or not token_ids:
            return ""
        self.num_tokens += len(token_ids)
        last = token_ids[-1]
        if last in self._special or last in self._stop_ids:  # stop tokens add no text
            token_ids = token_ids[:-1]
        if not self._stops:  # nothing to hold back or match: the delta is the text
            return self._detok.push_many(token_ids)
        self._text += self._detok.push_many(token_ids)
        self._match_stop()
        hold = 0 if self.stopped else self._hold
        upto = max(self._sent, len(self._text) - hold)
        text = self._text[self._sent : upto]
        self._sent = upto
        return text

    def _match_stop(self) -> None:
        if self.num_tokens <= self._min_tokens:
            return
        start = max(0, self._sent - self._hold - 1)
        best: tuple[int, str] | None = None
        for s in self._stops:
            pos = self._text.find(s, start)
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, s)
        if best is not None:
            pos, s = best
            self._text = self._text[: pos + (len(s) if self.include_stop else 0)]
            self._sent = min(self._sent, len(self._text))
            self.stop_str, self.stopped = s, True

    def rest(self) -> str:
        """At the end: whatever text is still held back (an incomplete trailing character
        becomes U+FFFD, unless a stop string cut the text)."""
        if not self.stopped:
            if not self._stops:
                return self._detok.flush()
            self._text += self._detok.flush()
        text = self._text[self._sent :]
        self._sent = len(self._text)
        return text

    def prompt_once(self) -> tuple[int, ...]:
        """The prompt's ids on the first chunk, if the client asked for them."""
        if self._prompt_sent or not self.request.return_prompt_token_ids:
            return ()
        self._prompt_sent = True
        return self.prompt_ids


def request_timings(arrival: float, first_scheduled: float | None, first_token: float | None,
                    last_token: float | None, now: float, delivery_lag: float = 0.0) -> Timings:
    """vLLM's intervals (docs/design/metrics.md, "Interval Calculations") on the emulated
    timeline: queue = arrival → first scheduled, prefill = first scheduled → first token,
    TTFT from arrival, decode = first → last token, e2e = arrival → last token (or `now` for a
    request that produced nothing)."""
    last = last_token if last_token is not None else now
    scheduled = first_scheduled if first_scheduled is not None else now
    return Timings(
        queue_s=max(0.0, scheduled - arrival),
        prefill_s=(first_token - scheduled) if first_token is not None else 0.0,
        ttft_s=(first_token - arrival) if first_token is not None else 0.0,
        decode_s=(last - first_token) if first_token is not None else 0.0,
        e2e_s=max(0.0, last - arrival),
        delivery_lag_s=delivery_lag,
    )
