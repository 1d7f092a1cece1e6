"""The virtual-time event loop's boundary (issue 16): what `sim.virtual.run_cluster` asks of
the fleet around it, and what it gives back.

Why it exists apart from `sim.virtual`: routers (sim/routers.py, sim/autoscale.py), controls
(the autoscaler) and record sinks (`clients.report.SummaryStream`, `sim.reports.FleetStream`)
are written against these, not against the loop; the fleet's `Dispatch` (admission, P/D) is in
`sim.virtual_pd`. A refused turn's record is built here, the one way for every refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from clients.conversation import Conversation
from clients.report import RequestResult
from server.engine.request import Request

# A cluster's router (sim/routers.py): (prompt token ids, outstanding requests per core, the
# session: its SLO class) -> the index of the core that gets the request; None: hold it (no
# replica is ready, as when an autoscaled pool is at zero; the loop routes it again after the
# control's next tick); or REFUSED: the router's admission sheds it (RESOURCE_EXHAUSTED, as
# `Dispatch.place`'s None). Called at the request's arrival time.
Route = Callable[[Sequence[int], Sequence[int], Conversation], int | None]
REFUSED = -1
# `Dispatch.place`'s "hold it": a role of a P/D fleet has no ready replica yet (an autoscaled
# pool at zero or still booting; sim/autoscale_pd.py); routed again after the next tick
HELD: tuple[int, int | None] = (-2, None)


class Records(Protocol):
    """Where a run puts each request's result: a list, or a `clients.report.SummaryStream`
    (a million requests summarised in flat memory)."""

    def append(self, result: RequestResult, /) -> None: ...


@dataclass
class VirtualRun:
    records: list[RequestResult] | Records = field(default_factory=list)
    duration_s: float = 0.0
    kv_usage_mean: float = 0.0  # time-weighted over busy steps
    kv_usage_peak: float = 0.0


class Control(Protocol):
    """A periodic controller of a cluster run (sim/autoscale.py): `tick(t)` is called once
    the clock reaches `next_at` (after that instant's step ends, before its arrivals), and an
    idle core k is charged idle power and money only while `bill_idle(k, t)` is true (an off
    replica costs nothing). The run ends when the traffic does, whatever `next_at` says.
    `held` is set before each tick (and before `can_serve_held`) to the SLO class of each
    request the router holds; a request held `hold_timeout_s` (when > 0) ends
    DEADLINE_EXCEEDED then, and held requests the control says it will never serve
    (`can_serve_held`) end as UNAVAILABLE."""

    held: list[str]
    hold_timeout_s: float  # a turn held longer ends DEADLINE_EXCEEDED (0: held until served)

    @property
    def next_at(self) -> float: ...

    def can_serve_held(self) -> bool: ...

    def tick(self, t: float) -> None: ...

    def bill_idle(self, k: int, t: float) -> bool: ...

    def finish(self, t: float) -> None: ...


def failed(rid: str, s: Conversation, ti: int, at: float, prompt_tokens: int, error: str,
           replica: int, end_s: float | None = None) -> RequestResult:
    """A turn refused at its arrival, or at `end_s` (`error`: the status the server or the
    gateway would answer)."""
    return RequestResult(rid, scheduled_s=at, sent_s=at, token_times=(),
                         end_s=at if end_s is None else end_s,
                         prompt_tokens=prompt_tokens, output_tokens=0, finish_reason="error",
                         error=error, conversation_id=s.conversation_id, turn=ti,
                         slo_class=s.slo_class, replica=replica)


def completed(r: Request, s: Conversation, ti: int, at: float, end_s: float,
              token_times: list[float], first_scheduled_s: float | None, replica: int,
              **pd: float | None) -> RequestResult:
    """A turn that ran to its finish on core `replica` (`pd`: its P/D hop's fields)."""
    return RequestResult(
        r.request_id, scheduled_s=at, sent_s=at, token_times=tuple(token_times), end_s=end_s,
        prompt_tokens=r.num_prompt_tokens, output_tokens=r.num_output_tokens,
        cached_tokens=max(r.num_cached_tokens, 0), jump_forward_tokens=r.num_jump_forward_tokens,
        finish_reason=r.finish_reason.value if r.finish_reason else "stop",
        conversation_id=s.conversation_id, turn=ti, slo_class=s.slo_class,
        first_scheduled_s=first_scheduled_s, preemptions=r.num_preemptions, replica=replica,
        **pd,
    )


def turn_id(s: Conversation, ti: int) -> str:
    """A turn's request id: the conversation's id, with `/turn` when it has several."""
    return f"{s.conversation_id}/{ti}" if len(s.turns) > 1 else s.conversation_id
