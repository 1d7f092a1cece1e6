"""Per-request results and the summary every target (virtual time or gRPC) reports.

Latencies of open-loop requests are measured from their *scheduled* send time, so a client or
server that falls behind shows up as queueing instead of hiding it (coordinated omission).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

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
    if not values:
        return {"mean": 0.0, **{f"p{p}": 0.0 for p in PERCENTILES}}
    arr = np.asarray(values, dtype=float)
    pct = np.percentile(arr, PERCENTILES)
    return {"mean": float(arr.mean()), **{f"p{p}": float(v) for p, v in zip(PERCENTILES, pct,
                                                                            strict=True)}}


def summarize(results: list[RequestResult], **extra: Any) -> dict[str, Any]:
    """The summary: counts, throughput, latency percentiles; `extra` keys are added as given."""
    ok = [r for r in results if r.ok]
    start = min((r.scheduled_s for r in results), default=0.0)
    end = max((r.end_s for r in results), default=0.0)
    duration = max(end - start, 1e-12)
    out_tokens = sum(r.output_tokens for r in ok)
    errors: dict[str, int] = {}
    for r in results:
        if r.error:
            errors[r.error] = errors.get(r.error, 0) + 1
    return {
        "requests": len(ok),
        "errors": errors,
        "error_rate": (len(results) - len(ok)) / len(results) if results else 0.0,
        "duration_s": duration if results else 0.0,
        "requests_per_s": len(ok) / duration if results else 0.0,
        "input_tokens_per_s": sum(r.prompt_tokens for r in ok) / duration if results else 0.0,
        "output_tokens_per_s": out_tokens / duration if results else 0.0,
        "ttft_s": stats([r.ttft for r in ok if r.ttft is not None]),
        "tpot_s": stats([r.tpot for r in ok if r.tpot is not None]),
        "itl_s": stats([gap for r in ok for gap in r.itls()]),
        "e2e_s": stats([r.e2e for r in ok]),
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "cached_prompt_tokens": sum(r.cached_tokens for r in ok),
        "output_tokens": out_tokens,
        "jump_forward_tokens": sum(r.jump_forward_tokens for r in ok),
        **extra,
    }


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


def goodput(results: list[RequestResult], slo: dict[str, float]) -> dict[str, float]:
    """Requests per second (and share of all requests) that met the SLO."""
    if not results:
        return {"requests_per_s": 0.0, "fraction": 0.0}
    good = sum(meets(r, slo) for r in results)
    start = min(r.scheduled_s for r in results)
    end = max(r.end_s for r in results)
    return {"requests_per_s": good / max(end - start, 1e-12), "fraction": good / len(results)}
