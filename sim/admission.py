"""Admission control at a virtual-time fleet's router (issue 16): which replicas may take one
more request, and when the router refuses it (RESOURCE_EXHAUSTED, as the server's own queue
limit answers).

Followed: the Gateway API Inference Extension's endpoint picker (kubernetes-sigs/
gateway-api-inference-extension, read at commits 1a00493a (concurrencydetector/detector.go)
and 8f87162a (utilizationdetector/detector.go) of pkg/epp/saturationdetector; llm-d's
inference scheduler builds on it). Its saturation detectors act twice: as a filter that drops
the endpoints past a limit before the picker scores the rest, and as a circuit breaker that
sheds the request when every candidate endpoint is saturated. Two of its rules:

- `max-outstanding=N` (the concurrency detector's MaxConcurrency): a replica is saturated when
  the router's own count of its in-flight requests is >= N. GIE's filter lets a replica go to
  N × (1 + headroom) (headroom default 0, and `<=`, so one over); here the filter uses the
  breaker's own test (`< N`), so no replica ever has more than N outstanding — the bound a
  planner asks for.
- `queue-depth=Q,kv-util=U` (the utilization detector, defaults 5 and 0.8 as GIE's legacy
  saturation detector): a replica has room while its waiting queue is < Q and its KV usage
  (blocks held by requests, `sim.routers.kv_usage`) is < U; metrics are read at the instant
  of routing (no staleness in virtual time).

The picker (the `--router` policy) chooses first; when its choice is saturated the request
goes to the least-outstanding replica that is not (the filter ahead of the picker, applied
after it so the stateful policies keep their order); none left: refused — unless its SLO class
is listed in `critical=CLASS+CLASS...`: GIE sheds only requests of negative priority when the
pool is saturated, and schedules the others anyway, to queue on the model server
(site-src/concepts/priority-and-capacity.md, "Priority and Capacity", read at the same
commits). Without `critical`, every class is sheddable (what a planner testing shedding asks
first); with it, a critical request goes to the picker's choice, past any limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from server.engine.core import EngineCore
from sim.routers import kv_usage


@dataclass(frozen=True)
class Admission:
    """The router's admission rules; a field left None is not checked."""

    max_outstanding: int | None = None
    queue_depth: int | None = None
    kv_util: float | None = None
    critical: tuple[str, ...] = ()  # SLO classes never shed (GIE: priority >= 0)

    def room(self, k: int, core: EngineCore, outstanding: Sequence[int]) -> bool:
        """Replica `k` may take one more request."""
        if self.max_outstanding is not None and outstanding[k] >= self.max_outstanding:
            return False
        if self.queue_depth is not None and core.scheduler.num_waiting >= self.queue_depth:
            return False
        return self.kv_util is None or kv_usage(core) < self.kv_util

    def pick(self, choice: int, group: Sequence[int], cores: Sequence[EngineCore],
             outstanding: Sequence[int], slo_class: str = "") -> int | None:
        """`choice` if it has room, else the least-outstanding replica of `group` with room
        (lower index on a tie), else `choice` for a critical class, else None: refused."""
        if self.room(choice, cores[choice], outstanding):
            return choice
        free = [k for k in group if self.room(k, cores[k], outstanding)]
        if free:
            return min(free, key=lambda k: (outstanding[k], k))
        return choice if slo_class in self.critical else None


def parse_admission(text: str | None) -> Admission | None:
    """`max-outstanding=8` / `queue-depth=5,kv-util=0.8` (any of the three) → Admission;
    None or "" → None. ValueError names a bad term."""
    if not text:
        return None
    values: dict[str, float] = {}
    critical: tuple[str, ...] = ()
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in _KEYS:
            raise ValueError(f"bad --admission term {part!r}: use max-outstanding=N, "
                             "queue-depth=Q, kv-util=U, critical=CLASS+CLASS")
        if key == "critical":
            critical = tuple(c.strip() for c in value.split("+"))
            if not all(critical):
                raise ValueError(f"bad --admission term {part!r}: name SLO classes, "
                                 "joined by +")
            continue
        try:
            values[key] = float(value)
        except ValueError:
            raise ValueError(f"bad --admission value in {part!r}: not a number") from None
    if not values:
        if critical:
            raise ValueError("--admission critical=... needs a limit to exempt its classes "
                             "from (max-outstanding, queue-depth or kv-util)")
        return None
    for key in ("max-outstanding", "queue-depth"):
        if key in values and (values[key] < 1 or not float(values[key]).is_integer()):
            raise ValueError(f"--admission {key} must be an integer >= 1")
    kv = values.get("kv-util")
    if kv is not None and not (0 < kv <= 1 and math.isfinite(kv)):
        raise ValueError("--admission kv-util must be in (0, 1]")
    if "queue-depth" in values and kv is None:
        kv = 0.8  # GIE's legacy default, with its queue-depth rule
    if kv is not None and "queue-depth" not in values:
        values["queue-depth"] = 5  # GIE's legacy default
    return Admission(
        max_outstanding=int(values["max-outstanding"]) if "max-outstanding" in values else None,
        queue_depth=int(values["queue-depth"]) if "queue-depth" in values else None,
        kv_util=kv,
        critical=critical,
    )


_KEYS = ("max-outstanding", "queue-depth", "kv-util", "critical")
