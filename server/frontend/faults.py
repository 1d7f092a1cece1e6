"""Request-level failure injection and stream cuts, in the front end, for every protocol.

Why it exists: routers and gateways are tested against servers that refuse requests. This is
llm-d-inference-sim's failure injection (`pkg/llm-d-inference-sim/failures.go` at
9fb8463afc87c565024daafbbcdfb01618f99d01; docs/FAULTS.md): with `failure_injection_rate`
percent, a generation request is refused before anything runs, with one of `failure_types`
(all six when none are given) chosen uniformly, and llm-d-inference-sim's message, HTTP
status and OpenAI error `type`; over gRPC the status its `extractGRPCCode` maps that HTTP
status to. Every request not chosen goes on as usual.

Only generation requests pass through here (`parallel.submit_all`: completions, chat
completions, `Inference.Generate`, `VllmEngine.Generate`, adapter requests included — they
resolve to their deployment first); one draw per client request, whatever its `n`.

Determinism: the k-th generation request a front end receives for a deployment is refused iff
`unit(seed, deployment, front end, k, "fail") < rate / 100`, its type from a second draw
(`server.engine.faults.unit`): the seed (`failure_injection_seed`, else the deployment's
`seed`) fixes the whole sequence. With one front end (`--api-server-count 1`) the k-th
request to arrive always meets the same fate; with several, each front end has its own
sequence (the kernel spreads connections among them).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from server.engine.errors import EngineError
from server.engine.faults import FAILURE_TYPES, FaultSpec, parse_specs, unit
from server.engine.options import EngineOptions
from server.frontend.stats import FrontendStats
from server.frontend.stream import RequestStream, StreamCut


@dataclass(frozen=True)
class FailureKind:
    """One of llm-d-inference-sim's predefined failures (`predefinedFailures`)."""

    status: int  # HTTP
    grpc: str  # grpc.StatusCode name (llm-d-inference-sim's extractGRPCCode of `status`)
    message: str  # "{model}" is the deployment's model name
    param: str | None = None


# llm-d-inference-sim failures.go; `type` is its ErrorCodeToType(status) (the openai SDK's)
KINDS = {
    "rate_limit": FailureKind(429, "RESOURCE_EXHAUSTED",
                              "Rate limit reached for {model} in organization org-xxx on "
                              "requests per min (RPM): Limit 3, Used 3, Requested 1."),
    "invalid_api_key": FailureKind(401, "UNAUTHENTICATED", "Incorrect API key provided."),
    "context_length": FailureKind(400, "INVALID_ARGUMENT",
                                  "This model's maximum context length is 4096 tokens. "
                                  "However, your messages resulted in 4500 tokens.",
                                  "messages"),
    "server_error": FailureKind(503, "UNAVAILABLE", "The server is overloaded or not ready yet."),
    "invalid_request": FailureKind(400, "INVALID_ARGUMENT",
                                   "Invalid request: missing required parameter 'model'.",
                                   "model"),
    "model_not_found": FailureKind(404, "NOT_FOUND", "The model '{model}-nonexistent' does not "
                                   "exist", "model"),
}
assert tuple(KINDS) == FAILURE_TYPES
log = logging.getLogger("doppelchip.frontend")
ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               429: "RateLimitError", 503: "InternalServerError"}


class InjectedFailure(EngineError):
    """A request refused by failure injection: its llm-d-inference-sim type and answer."""

    def __init__(self, failure_type: str, model: str) -> None:
        kind = KINDS[failure_type]
        super().__init__(kind.message.format(model=model))
        self.failure_type, self.kind = failure_type, kind

    @property
    def http_status(self) -> int:
        return self.kind.status

    @property
    def error_type(self) -> str:
        return ERROR_TYPES[self.kind.status]


class StreamCutRule:
    """When a stream is cut: after `after` tokens, if drawn (`percent`) or when a token comes
    inside the window [at, at + for) on the emulated timeline."""

    def __init__(self, spec: FaultSpec, drawn: bool, on_cut: Callable[[], None]) -> None:
        self.after, self.drawn, self.fired = spec.after, drawn, on_cut
        self.window = (spec.at, spec.at + spec.duration) if spec.at is not None else None

    def due(self, sent: int, now: float) -> bool:
        if sent < self.after:
            return False
        if self.window is None:
            return self.drawn
        return self.window[0] <= now < self.window[1]


class _QuietCuts(logging.Filter):
    """uvicorn and the app log a traceback for a response body that raised: an injected cut is not a
    bug, one line says what happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, StreamCut)  # counted_cut() logged it


def quiet_http_cuts() -> None:
    """Install the filter on the logs that report a failed response (once per process)."""
    for name in ("uvicorn.error", "doppelchip.http"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _QuietCuts) for f in logger.filters):
            logger.addFilter(_QuietCuts())


class RequestFaults:
    """One deployment's request-level faults in one front end (see the module docstring)."""

    def __init__(self, opts: EngineOptions, frontend: int, model: str, stats: FrontendStats,
                 key: tuple[int, int]) -> None:
        self.rate = opts.failure_injection_rate
        self.types = opts.failure_types or FAILURE_TYPES
        self.seed = opts.seed if opts.failure_injection_seed is None \
            else opts.failure_injection_seed
        self.key = (self.seed, opts.name, frontend)
        self.model = model
        self.cuts = parse_specs("stream_cut", opts.fault_stream_cut)
        self._count = itertools.count()
        self._stats, self._row = stats, stats.blocks[key].a  # counted on the first rank
        self._fail_at = {t: stats.layout.slot("doppelchip_failure_injections", t)
                         for t in FAILURE_TYPES}
        self._cut_at = stats.layout.slot("doppelchip_stream_cuts")

    @property
    def enabled(self) -> bool:
        return self.rate > 0 or bool(self.cuts)

    def draw(self, k: int) -> str | None:
        """The failure type of the k-th request (None: it goes on)."""
        if self.rate <= 0 or unit(*self.key, k, "fail") * 100 >= self.rate:
            return None
        return self.types[int(unit(*self.key, k, "type") * len(self.types))]

    def admit(self) -> int:
        """Number this request; raise InjectedFailure if it is chosen (and count it)."""
        k = next(self._count)
        failure = self.draw(k)
        if failure is not None:
            self._stats.begin()
            self._row[self._fail_at[failure]] += 1
            self._stats.end()
            raise InjectedFailure(failure, self.model)
        return k

    def arm(self, k: int, streams: Sequence[RequestStream]) -> None:
        """Give request k's streams their cut rule (the first stream_cut spec that applies)."""
        for i, spec in enumerate(self.cuts):
            drawn = spec.percent is not None and unit(*self.key, k, "cut", i) * 100 < spec.percent
            if spec.at is not None or drawn:
                rule = StreamCutRule(spec, drawn, self.counted_cut)
                for stream in streams:
                    stream.cut = rule
                return

    def counted_cut(self) -> None:
        log.info("fault injection: a stream of %s is cut mid-response", self.key[1])
        self._stats.begin()
        self._row[self._cut_at] += 1
        self._stats.end()
