"""The output side of one request: text deltas, stop strings, token times, timings.

vLLM's output processor in miniature, used by the front end that streams the request.
`RequestOutput.add(token_ids)` turns new tokens into the text to send now: text that could
still be the start of a stop string is held back until it cannot, so a client never sees text
that a stop string later takes back (with `include_stop_str_in_output` nothing is held: an
included stop string takes nothing back). Stop strings and stop tokens apply as in vLLM
0.33.0's `v1/engine/detokenizer.py`: searched only after the first `min_tokens` tokens' text,
the one completing first wins, a stop token's text is kept only when asked. Several tokens of
one step (jump-forward, or a consumer that fell behind) share the step's interval
(`spread_times`). Synchronous and clock-free: it only records what it is told.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

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


class _KeepSpecialDetokenizer:
    """`IncrementalDetokenizer` for `skip_special_tokens` false: a special token's text is its
    content (vLLM's DecodeStream with skip_special_tokens=False), other ids their bytes."""

    __slots__ = ("_bytes", "_special", "_utf8")

    def __init__(self, tokenizer: Tokenizer) -> None:
        added = tokenizer.config.get("added_tokens_decoder") or {}
        self._special = {int(i): str(t["content"]).encode() for i, t in added.items()
                         if int(i) in tokenizer.special_token_ids}
        self._bytes = tokenizer._token_bytes  # built now (at intake), not at the first token
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push_many(self, token_ids: Sequence[int]) -> str:
        special, raw = self._special, self._bytes
        return self._utf8.decode(b"".join([special[i] if i in special else raw[i]
                                           for i in token_ids]))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def first_stop(text: str, new_chars: int, stops: tuple[str, ...]) -> tuple[str, int] | None:
    """vLLM's `check_stop_strings` search: the stop string that completes earliest among those
    ending in the last `new_chars` characters of `text` (ties: the first in `stops`), with
    where it starts. Each is searched from `len - 1` characters before the new text, so one
    straddling old and new text matches and already-searched text is not searched again."""
    best: tuple[str, int] | None = None
    best_end = len(text) + 1
    window = len(text) - new_chars + 1
    for s in stops:
        pos = text.find(s, max(0, window - len(s)))
        if pos >= 0 and pos + len(s) < best_end:
            best, best_end = (s, pos), pos + len(s)
    return best


class RequestOutput:
    """Detokenization and stop strings of one request (the text it streams), as vLLM's
    `BaseIncrementalDetokenizer.update` and `get_next_output_text` (v1/engine/detokenizer.py)."""

    __slots__ = ("_constrained", "_detok", "_eos", "_hold", "_may_end",
                 "_min_tokens", "_prompt_sent", "_sent", "_stops", "_text", "include_stop",
                 "num_tokens", "prompt_ids", "request", "stop_str", "stopped")

    def __init__(self, request: EngineRequest, prompt_ids: tuple[int, ...],
                 tokenizer: Tokenizer) -> None:
        self.request = request
        self.prompt_ids = prompt_ids
        self.num_tokens = 0
        self.stop_str: str | None = None
        self.stopped = False  # a stop string matched: the request ends with reason stop
        sp = request.sampling
        self._detok = (tokenizer.detokenizer() if sp.skip_special_tokens
                       else _KeepSpecialDetokenizer(tokenizer))
        self._stops = sp.stop
        self._min_tokens = sp.min_tokens
        self.include_stop = sp.include_stop_str_in_output
        # the tokens that may end the request with reason stop (`SamplingParams.stops_at`,
        # the scheduler's rule, decides; the set lets every other token pass at once)
        self._eos = tokenizer.eos_token_id
        self._constrained = request.constraint is not None
        self._may_end = frozenset(sp.stop_token_ids) | {self._eos}
        # vLLM's stop_buffer_length: an included stop string never takes text back
        self._hold = (max(len(s) for s in self._stops) - 1
                      if self._stops and not self.include_stop else 0)
        self._text = ""
        self._sent = 0  # characters of _text already streamed
        self._prompt_sent = False

    @property
    def has_stops(self) -> bool:
        return bool(self._stops)

    def add(self, token_ids: list[int]) -> str:
        """The text to stream for these new tokens ("" while held back). After a stop string
        matched (`stopped`), later tokens add nothing.

        As vLLM's `update`: a stop token that ends the request adds no text unless
        `include_stop_str_in_output` (then it is searched for stop strings too); stop strings
        are searched only in text after the first `min_tokens` tokens' (`stop_check_offset`)."""
        if self.stopped or not token_ids:
            return ""
        before = self.num_tokens
        self.num_tokens += len(token_ids)
        last = token_ids[-1]
        if (not self.include_stop and last in self._may_end
                and self.request.sampling.stops_at(last, self.num_tokens, self._eos,
                                                   self._constrained)):
            token_ids = token_ids[:-1]
        if not self._stops:  # nothing to hold back or match: the delta is the text
            return self._detok.push_many(token_ids)
        if self.num_tokens > self._min_tokens:
            inside = self._min_tokens - before  # new tokens still within min_tokens
            if inside > 0:
                self._text += self._detok.push_many(token_ids[:inside])
                token_ids = token_ids[inside:]
            offset = len(self._text)
            self._text += self._detok.push_many(token_ids)
            self._match_stop(len(self._text) - offset)
        else:
            self._text += self._detok.push_many(token_ids)
        hold = 0 if self.stopped else self._hold
        upto = max(self._sent, len(self._text) - hold)
        text = self._text[self._sent : upto]
        self._sent = upto
        return text

    def _match_stop(self, new_chars: int) -> None:
        """Truncate at the stop string completing first in the new text, as vLLM: before it,
        or after it when it is included in the output."""
        if not new_chars or (found := first_stop(self._text, new_chars, self._stops)) is None:
            return
        s, pos = found
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
