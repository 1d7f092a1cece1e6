"""Engine events for observers (metrics): what a step did, when tokens appeared, how a request
ended. The engine calls an `EngineObserver`; it never imports the service layer or Prometheus.

All times are on the deployment's emulated timeline (seconds). Hooks run on the engine loop, so
an observer must be quick and must not raise (an exception would stop the deployment's loop).

Inter-token latency (DESIGN.md, "The service"): the emulated interval between consecutive
output tokens of one request; a step that yields n tokens of one request at once (jump-forward)
records interval/n, n times. The first tokens of a request are its time to first token, not an
inter-token interval (vLLM's definition: docs/design/metrics.md, "Interval Calculations").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from server.engine.core import StepResult
from server.engine.interface import Finish


@dataclass(frozen=True)
class StepEvent:
    """One engine step: `result` carries the cost breakdown; `start`/`end` its emulated span."""

    start: float
    end: float
    result: StepResult
    lag_s: float  # how late (emulated seconds) the loop woke after the step's deadline


@dataclass(frozen=True)
class TokensEvent:
    """`n` new output tokens of one request, streamed at emulated time `t`."""

    request_id: str
    n: int
    t: float
    previous_t: float | None  # when the request's previous tokens appeared; None: its first
    arrival: float

    @property
    def ttft(self) -> float | None:
        return self.t - self.arrival if self.previous_t is None else None

    def inter_token_latencies(self) -> list[float]:
        """interval/n, n times (jump-forward); empty for the request's first tokens."""
        if self.previous_t is None or self.n <= 0:
            return []
        return [(self.t - self.previous_t) / self.n] * self.n


@dataclass(frozen=True)
class FinishedEvent:
    """A request ended (any reason, abort included): its final chunk's usage and timings."""

    request_id: str
    finish: Finish
    max_tokens: int | None  # the request's max_tokens parameter as sent (None: unset)


class EngineObserver(Protocol):
    def on_startup(self, seconds: float, cold: bool) -> None:
        """The deployment built/loaded its engine for `seconds` (emulated) before serving."""

    def on_step(self, event: StepEvent) -> None: ...

    def on_tokens(self, event: TokensEvent) -> None: ...

    def on_request_finished(self, event: FinishedEvent) -> None: ...


class NullObserver:
    """The default: observes nothing."""

    def on_startup(self, seconds: float, cold: bool) -> None:
        pass

    def on_step(self, event: StepEvent) -> None:
        pass

    def on_tokens(self, event: TokensEvent) -> None:
        pass

    def on_request_finished(self, event: FinishedEvent) -> None:
        pass
