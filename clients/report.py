"""Per-request results and the summary every target (virtual time or gRPC) reports.

Latencies of open-loop requests are measured from their *scheduled* send time, so a client or
server that falls behind shows up as queueing instead of hiding it (coordinated omission).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from clients.quantiles import Quantiles

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class RequestResult:
    """One request's result, in real time (a client's measurements: clients/loadgen.py) and
    in virtual time (the simulator's records: sim/virtual.py) alike — the one record type
    every report reads. Times are seconds from the start of the run; in virtual time a
    request is sent when it is scheduled (`sent_s == scheduled_s`, its arrival)."""

    request_id: str
    scheduled_s: float
    sent_s: float
    token_times: tuple[float, ...]  # arrival of each output token
    end_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    jump_forward_tokens: int = 0
    finish_reason: str = "length"
    error: str | None = None  # gRPC status code name when the request failed
    conversation_id: str = ""
    turn: int = 0
    slo_class: str = ""  # the request's SLO class ("" untagged; issue 16)
    # what only a simulator sees (virtual time; left at their defaults by a client)
    first_scheduled_s: float | None = None  # when a step first ran it
    preemptions: int = 0
    replica: int = 0  # the core that served it (a cluster's replica; -1: refused at the router)
    prefill_replica: int | None = None  # the core that prefilled it (disaggregated P/D)
    prefill_end_s: float | None = None  # when that prefill ended (its KV then moved)
    kv_transfer_s: float = 0.0  # seconds its KV spent on the link (queueing excluded)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.scheduled_s if self.token_times else None

    @property
    def e2e(self) -> float:
        return self.end_s - self.scheduled_s

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else None

    def itls(self) -> list[float]:
        return list(np.diff(self.token_times)) if len(self.token_times) > 1 else []


def stats(values: list[float]) -> dict[str, float]:
    """mean and percentiles (p50/p90/p95/p99) of `values`; zeros when there are none."""
    q = Quantiles()
    q.extend(values)
    return q.stats(PERCENTILES)


def summarize(results: Iterable[RequestResult], **extra: Any) -> dict[str, Any]:
    """The summary: counts, throughput, latency percentiles; `extra` keys are added as given."""
    stream = SummaryStream()
    for r in results:
        stream.add(r)
    return stream.summary(**extra)


class SummaryStream:
    """`summarize` one result at a time, keeping no result (unless `keep`): what a run of a
    million requests reports in flat memory. Counts and sums are exact; latencies go to
    `clients.quantiles.Quantiles` (exact up to its bound, then a sketch whose error it states).
    With an `slo`, it also counts the requests meeting it (`goodput`); without `itl`, it skips
    the inter-token gaps (a part of a fleet's report that shows no ITL)."""

    def __init__(self, slo: dict[str, float] | None = None, keep: bool = False,
                 itl: bool = True) -> None:
        self.slo, self.with_itl = slo, itl
        self.records: list[RequestResult] | None = [] if keep else None
        self.count = self.ok = self.good = 0
        self.start, self.end = math.inf, -math.inf
        self.errors: dict[str, int] = {}
        self.prompt = self.cached = self.output = self.jump_forward = 0
        self.ttft, self.tpot, self.itl, self.e2e = (Quantiles() for _ in range(4))

    def add(self, r: RequestResult) -> None:
        if self.records is not None:
            self.records.append(r)
        self.count += 1
        self.start = min(self.start, r.scheduled_s)
        self.end = max(self.end, r.end_s)
        if self.slo is not None and meets(r, self.slo):
            self.good += 1
        if r.error:
            self.errors[r.error] = self.errors.get(r.error, 0) + 1
        if not r.ok:
            return
        self.ok += 1
        self.prompt += r.prompt_tokens
        self.cached += r.cached_tokens
        self.output += r.output_tokens
        self.jump_forward += r.jump_forward_tokens
        times = r.token_times
        if times:
            self.ttft.add(times[0] - r.scheduled_s)
            if len(times) > 1:
                self.tpot.add((times[-1] - times[0]) / (len(times) - 1))
                if self.with_itl:  # np.diff's doubles, in bulk over many requests
                    self.itl.extend_gaps(times)
        self.e2e.add(r.e2e)

    append = add  # a runner appends its records to a list or to this alike

    def summary(self, **extra: Any) -> dict[str, Any]:
        n = self.count
        start = self.start if n else 0.0
        end = self.end if n else 0.0
        duration = max(end - start, 1e-12)
        return {
            "requests": self.ok,
            "errors": dict(self.errors),
            "error_rate": (n - self.ok) / n if n else 0.0,
            "duration_s": duration if n else 0.0,
            "requests_per_s": self.ok / duration if n else 0.0,
            "input_tokens_per_s": self.prompt / duration if n else 0.0,
            "output_tokens_per_s": self.output / duration if n else 0.0,
            "ttft_s": self.ttft.stats(PERCENTILES),
            "tpot_s": self.tpot.stats(PERCENTILES),
            "itl_s": self.itl.stats(PERCENTILES),
            "e2e_s": self.e2e.stats(PERCENTILES),
            "prompt_tokens": self.prompt,
            "cached_prompt_tokens": self.cached,
            "output_tokens": self.output,
            "jump_forward_tokens": self.jump_forward,
            **extra,
        }

    def goodput(self) -> dict[str, float]:
        """`goodput(results, slo)` of the results added (needs the `slo` given at start)."""
        if self.slo is None:
            raise ValueError("goodput needs the SLO the stream was started with")
        if not self.count:
            return {"requests_per_s": 0.0, "fraction": 0.0}
        return {"requests_per_s": self.good / max(self.end - self.start, 1e-12),
                "fraction": self.good / self.count}


SLO_METRICS = ("ttft", "tpot", "e2e")


def parse_slo(text: str) -> dict[str, float]:
    """`ttft=0.5,tpot=0.05` → {"ttft": 0.5, "tpot": 0.05} (seconds; ttft, tpot and e2e)."""
    slo: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"bad SLO term {part!r}: use e.g. ttft=0.5,tpot=0.05 "
                             f"(metrics: {', '.join(SLO_METRICS)})")
        try:
            slo[name] = float(value)
        except ValueError:
            raise ValueError(f"bad SLO value in {part!r}: not a number") from None
        if not 0 < slo[name] < math.inf:  # (NaN too: every comparison with it is false)
            raise ValueError(f"SLO bound {name} must be a finite number of seconds > 0, "
                             f"got {value!r}")
    return slo


def meets(result: RequestResult, slo: dict[str, float]) -> bool:
    """A request meets the SLO if it succeeded and every named latency is within bounds."""
    if not result.ok:
        return False
    for name, bound in slo.items():
        value = getattr(result, name)
        if value is not None and value > bound:
            return False
    return True


def goodput(results: Iterable[RequestResult], slo: dict[str, float]) -> dict[str, float]:
    """Requests per second (and share of all requests) that met the SLO."""
    stream = SummaryStream(slo)
    for r in results:
        stream.add(r)
    return stream.goodput()
