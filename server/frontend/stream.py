"""One request's stream on the front end: tokens in (from engine step messages), chunks out.

The receiver `push`es each step's new tokens (cheap: a list extend and the step's time) and
wakes the consumer when `stream_interval` tokens are pending (vLLM's `--stream-interval`:
the first tokens and the finish go at once), times the front end's `LoopPacer` factor while
its event loop is saturated. The consumer (`outputs()`, iterated by a
servicer) turns everything pending into one `TokenChunk`: a consumer that falls behind gets
what piled up in one message, not one message per token. Requests with stop strings are
detokenized as each step arrives (`eager`), so a stop string ends them at the step it appears,
as vLLM's output processor does.

Contract: exactly one `TokenChunk` carries `finish`, and it is the last; `fail(message)`
instead makes the iteration raise `StreamFailed` (the engine process died).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from server.engine.interface import EngineRequest, Finish, FinishReason, TokenChunk, Usage
from server.engine.output import RequestOutput, request_timings, spread_times
from server.engine.spec_metrics import RequestSpecDecodeMetrics
from server.frontend.pacing import UNPACED, LoopPacer


class StreamFailed(Exception):
    """The request cannot finish: its engine process died (the message says so)."""


class StreamCut(StreamFailed):
    """Fault injection cut the stream mid-response (server/frontend/faults.py)."""


class RequestStream:
    __slots__ = (
        "_clock",
        "_error",
        "_event",
        "_finish",
        "arrival",
        "cached",
        "client_id",
        "cut",
        "deployment",
        "eager",
        "external",
        "first_scheduled",
        "first_token",
        "interval",
        "jumped",
        "kv_transfer_params",
        "lag",
        "last_token",
        "logged",
        "n_out",
        "out",
        "pacer",
        "pending",
        "pending_first",
        "pending_text",
        "pending_times",
        "preemptions",
        "rank",
        "request",
        "request_id",
        "sent",
        "seq",
        "spec_decode_metrics",
        "versions",
        "want_times",
    )

    def __init__(self, request: EngineRequest, out: RequestOutput, *, seq: int, deployment: int,
                 rank: int, arrival: float, interval: int, clock: Callable[[], float],
                 pacer: LoopPacer = UNPACED) -> None:
        self.request, self.out = request, out
        self.request_id = request.request_id
        self.client_id: str | None = None  # the id the client owns (DeploymentClient.claim)
        self.cut = None  # a StreamCutRule (fault injection, issue 13) or None
        self.seq, self.deployment, self.rank = seq, deployment, rank
        self.arrival = arrival
        self.interval = max(1, interval)
        self.pacer = pacer  # its factor multiplies the interval while the loop is saturated
        self.want_times = request.return_token_times
        self.logged = request.log_metrics  # False: the front end's metrics skip it
        self.eager = out.has_stops
        self._clock = clock  # emulated now, on the shared timeline
        self.first_scheduled: float | None = None
        self.cached = 0  # prompt tokens served from the prefix cache (at first scheduling)
        self.external = 0  # P/D: of those, prompt tokens whose KV a prefill pod sent
        self.kv_transfer_params: dict | None = None  # P/D: what a prefill returns
        self.spec_decode_metrics: RequestSpecDecodeMetrics | None = None  # as the engine ended it
        self.jumped = 0  # output tokens appended by jump-forward
        self.preemptions = 0  # times the engine preempted it
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.n_out = 0  # tokens received from the engine (and not cut by a stop string)
        self.sent = 0  # tokens handed to the consumer so far
        self.pending: list[int] = []
        self.pending_times: list[float] = []
        self.pending_text = ""  # eager streams: text already detokenized, not yet sent
        self.pending_first = 0.0  # emulated time of the oldest pending token
        self.lag = 0.0  # the largest delivery lag so far (emulated seconds)
        self._finish: tuple[FinishReason, int | None] | None = None
        self._error: str | None = None
        self._event = asyncio.Event()
        # vLLM's weight_version_starts: (version, first output token it sampled), when asked
        self.versions: list[tuple[str, int]] | None = (
            [] if request.return_weight_versions else None)

    # ---- producer side (the receiver) ---------------------------------------------------------
    def push(self, tokens: list[int], t: float) -> bool:
        """A step ending at emulated `t` brought these tokens. True when a stop string matched
        in them: the request is finished here (the receiver tells the engine)."""
        if not self.pending:
            self.pending_first = t
        if self.want_times:
            self.pending_times.extend(spread_times(self.last_token, t, len(tokens)))
        self.pending.extend(tokens)
        if self.first_token is None:
            self.first_token = t
        self.last_token = t
        self.n_out += len(tokens)
        if self.eager:
            self.pending_text += self.out.add(tokens)
            if self.out.stopped:
                self._finish = (FinishReason.STOP, None)
                self._event.set()
                return True
        if self.sent == 0 or len(self.pending) >= self.interval * self.pacer.factor:
            self._event.set()
        return False

    def track_weight_version(self, version: str) -> None:
        """The next tokens were sampled by weights labelled `version` (vLLM: a span starts
        where the version changes)."""
        versions = self.versions
        if versions is not None and (not versions or versions[-1][0] != version):
            versions.append((version, self.n_out))

    def weight_version_spans(self) -> tuple[tuple[str, int, int], ...] | None:
        """vLLM's WeightVersionSpan list over the output tokens (a stop string's trimmed
        tokens taken off the last spans)."""
        if self.versions is None:
            return None
        n = self.out.num_tokens
        starts = self.versions
        ends = [s for _, s in starts[1:]] + [n]
        return tuple((v, min(s, n), min(e, n)) for (v, s), e in zip(starts, ends, strict=True)
                     if min(s, n) < min(e, n))

    def finish(self, reason: FinishReason, stop_token_id: int | None = None,
               kv_transfer_params: dict | None = None,
               spec_decode_metrics: RequestSpecDecodeMetrics | None = None) -> None:
        """The request ended: by the engine (EOS, stop token, length) or, with reason abort,
        by the front end (drain)."""
        if self._finish is None:
            self.kv_transfer_params = kv_transfer_params
            self.spec_decode_metrics = spec_decode_metrics
            self._finish = (reason, stop_token_id)
            self._event.set()

    def fail(self, message: str) -> None:
        self._error = message
        self._event.set()

    @property
    def done(self) -> bool:
        return self._finish is not None or self._error is not None

    # ---- consumer side ------------------------------------------------------------------------
    async def outputs(self) -> AsyncIterator[TokenChunk]:
        out = self.out
        while True:
            await self._event.wait()
            self._event.clear()
            if self._error is not None:
                raise StreamFailed(self._error)
            ids, times = self.pending, self.pending_times
            if ids:
                self.pending, self.pending_times = [], []
                now = self._clock()
                if now - self.pending_first > self.lag:
                    self.lag = now - self.pending_first
            index = self.sent
            self.sent += len(ids)
            if self.eager:
                text, self.pending_text = self.pending_text, ""
            else:
                text = out.add(ids)
            if self._finish is None:
                if ids:
                    yield self._chunk(ids, text, times, index)
                    if self.cut is not None and self.cut.due(self.sent, self._clock()):
                        self.cut.fired()
                        raise StreamCut(f"stream cut by fault injection after {self.sent} "
                                        "tokens")
                continue
            yield self._final(ids, text + out.rest(), times, index)
            return

    def _chunk(self, ids: list[int], text: str, times: list[float], index: int) -> TokenChunk:
        arrival = self.arrival
        return TokenChunk(
            token_ids=tuple(ids), text=text,
            token_times=tuple(x - arrival for x in times) if self.want_times else (),
            index=index, prompt_token_ids=self.out.prompt_once(),
        )

    def _final(self, ids: list[int], text: str, times: list[float], index: int) -> TokenChunk:
        assert self._finish is not None
        reason, stop_token = self._finish
        timings = request_timings(self.arrival, self.first_scheduled, self.first_token,
                                  self.last_token, self._clock(), self.lag)
        usage = Usage(len(self.out.prompt_ids), self.cached, self.out.num_tokens, self.jumped)
        finish = Finish(reason, usage, timings, self.out.stop_str,
                        stop_token if self.out.stop_str is None else None,
                        self.kv_transfer_params, self.weight_version_spans(),
                        self.spec_decode_metrics)
        chunk = self._chunk(ids, text, times, index)
        return TokenChunk(chunk.token_ids, chunk.text, chunk.token_times, chunk.index,
                          chunk.prompt_token_ids, finish)
