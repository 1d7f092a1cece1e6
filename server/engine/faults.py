"""Fault schedules: when a deployment's device misbehaves, as a pure function of its options.

Why it exists: device faults (a slowdown window, a hang, an engine crash, lost chips) and
stream cuts are configured per deployment (fleet-file keys `fault_*`, flags `--fault-*`) as
short specs, and every process that acts on them (the engine core, a restarted engine core,
the front ends) must agree on *when* they happen. So a fault's windows are computed here from
the spec and the seed alone, on the emulated timeline every process of a server shares
(seconds since the server started; `server.engine.clock`) — not on wall time, so a test at
`time_scale` 0.01 sees the same schedule, in emulated seconds, as a server at true speed, and
the metrics and token times (which are emulated) line up with it.

A spec is `key=value` pairs separated by commas; each deployment key takes a list of specs:
- scheduled: `at=T` (emulated seconds since start), with `for=D` where the kind has a duration;
- random: `rate=R` (events per emulated second, a Poisson process drawn from the seed, so
  the same seed gives the same event times in every process and after every restart).
Kind-specific keys: slowdown `factor=F` (> 1), lost_chips `chips=K` (optional `for=D`: the
chips come back; without it they stay lost until the engine restarts), stream_cut
`after=K` (tokens delivered before the cut) with `at=T,for=D` (streams delivering in the
window are cut) or `percent=P` (that share of requests, drawn per request from the seed).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.engine.options import EngineOptions

DEVICE_FAULTS = ("slowdown", "hang", "crash", "lost_chips")
_KEYS = {
    "slowdown": ({"factor"}, {"for"}),  # (required, required-with-a-duration)
    "hang": (set(), {"for"}),
    "crash": (set(), set()),
    "lost_chips": ({"chips"}, set()),
    "stream_cut": ({"after"}, set()),
}
_OPTIONAL = {"lost_chips": {"for"}, "stream_cut": {"for", "percent"}}
HORIZON_S = 10 * 365 * 86400.0  # random events are drawn up to ten emulated years


@dataclass(frozen=True)
class FaultSpec:
    """One parsed spec: a schedule (`at`/`for`) or a random process (`rate`/`for`), with the
    kind's parameters."""

    kind: str
    at: float | None = None
    rate: float | None = None
    duration: float = 0.0
    factor: float = 1.0
    chips: int = 0
    after: int = 0
    percent: float | None = None


@dataclass(frozen=True)
class Window:
    """One occurrence of a fault: [start, end) on the emulated timeline (end == start for an
    instant: a crash; end inf: lost chips that never come back)."""

    kind: str
    start: float
    end: float
    spec: FaultSpec


def parse_spec(kind: str, text: str) -> FaultSpec:
    """`"at=30,for=10,factor=3"` → FaultSpec; ValueError naming what is wrong."""
    where = f"fault_{kind} {text!r}"
    values: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"{where}: {part!r} is not key=value")
        try:
            values[key] = float(raw)
        except ValueError:
            raise ValueError(f"{where}: {key} must be a number, got {raw.strip()!r}") from None
        if not math.isfinite(values[key]) or values[key] < 0:
            raise ValueError(f"{where}: {key} must be a finite number >= 0")
    required, timed = _KEYS[kind]
    when = {"at", "rate", "percent"} & set(values)
    allowed = required | timed | _OPTIONAL.get(kind, set()) | {"at", "rate"}
    if kind == "stream_cut":
        allowed -= {"rate"}
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: "
                         f"{', '.join(sorted(allowed))})")
    if len(when) != 1:
        choices = "at= or percent=" if kind == "stream_cut" else "at= or rate="
        raise ValueError(f"{where}: give exactly one of {choices}")
    missing = sorted((required | timed) - set(values))
    if kind == "stream_cut" and "at" in values and "for" not in values:
        missing.append("for")
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    spec = FaultSpec(kind, at=values.get("at"), rate=values.get("rate"),
                     duration=values.get("for", math.inf if kind == "lost_chips" else 0.0),
                     factor=values.get("factor", 1.0), chips=int(values.get("chips", 0)),
                     after=int(values.get("after", 0)), percent=values.get("percent"))
    if kind == "slowdown" and spec.factor <= 1:
        raise ValueError(f"{where}: factor must be > 1")
    if kind in ("slowdown", "hang") and spec.duration <= 0:
        raise ValueError(f"{where}: for must be > 0")
    if kind == "lost_chips" and (spec.chips < 1 or spec.chips != values["chips"]):
        raise ValueError(f"{where}: chips must be a whole number >= 1")
    if kind == "stream_cut" and (spec.after < 1 or spec.after != values["after"]):
        raise ValueError(f"{where}: after must be a whole number of tokens >= 1")
    if spec.rate is not None and spec.rate <= 0:
        raise ValueError(f"{where}: rate must be > 0")
    if spec.percent is not None and spec.percent > 100:
        raise ValueError(f"{where}: percent must be in [0, 100]")
    return spec


FAULT_OPTIONS = ("fault_slowdown", "fault_hang", "fault_crash", "fault_lost_chips")


def has_device_faults(opts) -> bool:
    """Whether a deployment (an EngineOptions) has any device fault configured."""
    return any(getattr(opts, k) for k in FAULT_OPTIONS)


def has_faults(opts) -> bool:
    """Whether a deployment has any failure injection at all (its metrics are exported only
    then: a pod without faults keeps its scrape as small as before)."""
    return bool(opts.failure_injection_rate or opts.fault_stream_cut
                or has_device_faults(opts))


def parse_specs(kind: str, texts: tuple[str, ...]) -> tuple[FaultSpec, ...]:
    return tuple(parse_spec(kind, t) for t in texts)


def unit(*key: object) -> float:
    """A uniform draw in [0, 1) that is a pure function of `key` (BLAKE2b, 64 bits): the same
    key gives the same draw in every process, order and restart."""
    digest = hashlib.blake2b(":".join(map(str, key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def windows(spec: FaultSpec, seed: int, index: int) -> Iterator[Window]:
    """The occurrences of `spec` (the `index`-th spec of its kind) in time order."""
    if spec.at is not None:
        yield Window(spec.kind, spec.at, spec.at + spec.duration, spec)
        return
    if spec.rate is None:
        return
    rng = random.Random(f"doppelchip-fault:{seed}:{spec.kind}:{index}")
    t = 0.0
    while True:
        t += rng.expovariate(spec.rate)
        if t > HORIZON_S:
            return
        yield Window(spec.kind, t, t + spec.duration, spec)
        t += spec.duration  # occurrences of one spec do not overlap


class Schedule:
    """Every occurrence of one deployment's device faults, merged in start order, consumed as
    the timeline passes them (`due`), from `arm(t)`: an engine incarnation ignores what
    happened before it was ready (a restart does not replay the crash that caused it)."""

    def __init__(self, specs: dict[str, tuple[FaultSpec, ...]], seed: int) -> None:
        self._iters = [windows(s, seed, i) for kind in DEVICE_FAULTS
                       for i, s in enumerate(specs.get(kind, ()))]
        self._heads: list[Window | None] = [next(it, None) for it in self._iters]

    def arm(self, t: float) -> list[Window]:
        """Skip occurrences that started before `t` (those still running are returned)."""
        running = []
        for i, w in enumerate(self._heads):
            while w is not None and w.start < t:
                if w.end > t and w.kind != "crash":
                    running.append(Window(w.kind, t, w.end, w.spec))
                w = next(self._iters[i], None)
            self._heads[i] = w
        return running

    def next_start(self) -> float | None:
        starts = [w.start for w in self._heads if w is not None]
        return min(starts) if starts else None

    def due(self, t: float) -> list[Window]:
        """The occurrences that start at or before `t`, in start order, consumed."""
        out = []
        for i, w in enumerate(self._heads):
            while w is not None and w.start <= t:
                out.append(w)
                w = next(self._iters[i], None)
            self._heads[i] = w
        return sorted(out, key=lambda w: w.start)


# llm-d-inference-sim's failure type names (failures.go); the front end maps each to its
# status and message (server/frontend/faults.py KINDS), the metrics label them
FAILURE_TYPES = ("rate_limit", "invalid_api_key", "context_length", "server_error",
                 "invalid_request", "model_not_found")


def check_options(opts: EngineOptions) -> None:
    """ValueError naming the first bad failure-injection option of a deployment (here, not in
    the front end, so that the fleet file's parser needs only the engine layer)."""
    if not 0 <= opts.failure_injection_rate <= 100:
        raise ValueError(f"failure_injection_rate must be in [0, 100] (percent), got "
                         f"{opts.failure_injection_rate}")
    for t in opts.failure_types:
        if t not in FAILURE_TYPES:
            raise ValueError(f"invalid failure type {t!r}, valid types are: "
                             f"{', '.join(FAILURE_TYPES)}")
    for kind in ("slowdown", "hang", "crash", "lost_chips", "stream_cut"):
        parse_specs(kind, getattr(opts, f"fault_{kind}"))
