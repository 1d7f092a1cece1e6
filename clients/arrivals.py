"""Arrival processes: when each request (or conversation) of an open-loop workload is sent."""

from __future__ import annotations

import itertools
import math

import numpy as np


def arrival_times(n: int, rate: float, kind: str, rng: np.random.Generator,
                  burstiness: float = 1.0, ramp_up_s: float = 0.0) -> list[float]:
    """`n` send times in seconds from the start, non-decreasing.

    rate: mean arrivals per second once ramped up; inf sends everything at t=0.
    kind: constant (evenly spaced), poisson (exponential gaps), gamma (gaps drawn from a gamma
    distribution with shape `burstiness`: < 1 is burstier than Poisson, 1 is Poisson).
    ramp_up_s: the rate grows linearly from 0 to `rate` over this many seconds (a warm-up), by
    running the process in operational time Λ(t) = ∫ rate(t) dt and mapping it back.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    if not rate > 0:
        raise ValueError(f"rate must be > 0 (or inf), got {rate}")
    if not (math.isfinite(ramp_up_s) and ramp_up_s >= 0):
        raise ValueError(f"ramp_up_s must be a finite number >= 0, got {ramp_up_s}")
    if math.isinf(rate):
        return [0.0] * n
    if kind == "constant":
        gaps = np.full(n, 1.0 / rate)
    elif kind == "poisson":
        gaps = rng.exponential(1.0 / rate, size=n)
    elif kind == "gamma":
        if not (math.isfinite(burstiness) and burstiness > 0):
            raise ValueError(f"burstiness must be a finite number > 0, got {burstiness}")
        gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    else:
        raise ValueError(f"unknown arrival process {kind!r}; constant, poisson or gamma")
    times = np.cumsum(gaps) - gaps[0] if n else gaps  # the first request goes at t=0
    if ramp_up_s > 0:
        times = _ramp(times, ramp_up_s)
    return [float(t) for t in times]


def _ramp(steady: np.ndarray, ramp_s: float) -> np.ndarray:
    """Map times of a constant-rate process to one whose rate ramps linearly over `ramp_s`.

    With a rate ramping from 0 to r over R seconds, the expected count by time t is
    r·t²/(2R) for t < R and r·(t − R/2) after, i.e. a constant-rate process's time u maps to
    t = sqrt(2·R·u) for u < R/2 and u + R/2 after."""
    half = ramp_s / 2
    return np.where(steady < half, np.sqrt(2 * ramp_s * steady), steady + half)


# --- time-varying traffic (issue 16; docs/AUTOSCALING.md) ---------------------------------
class RateShape:
    """An arrival rate that changes with time: `rate(t)` requests per second for t >= 0,
    bounded by `peak`. `end_s` is where the shape stops (None: it goes on for ever);
    `zero_from` where its rate falls to 0 for ever (None: never), so that no draw waits there
    for an arrival that cannot come."""

    name = ""
    end_s: float | None = None

    def __init__(self, **params: float) -> None:
        self.p = params

    @property
    def zero_from(self) -> float | None:
        return None

    def rate(self, t: float) -> float:
        raise NotImplementedError

    @property
    def peak(self) -> float:
        raise NotImplementedError


class Ramp(RateShape):
    """Linear from `from` to `to` over `over` seconds, then constant at `to`."""

    name, keys = "ramp", ("from", "to", "over")

    def rate(self, t: float) -> float:
        a, b, over = self.p["from"], self.p["to"], self.p["over"]
        return b if t >= over else a + (b - a) * t / over

    @property
    def peak(self) -> float:
        return max(self.p["from"], self.p["to"])

    @property
    def zero_from(self) -> float | None:
        return self.p["over"] if self.p["to"] == 0 else None


class Diurnal(RateShape):
    """A day in `period` seconds: a sinusoid between `min` (at t = 0, the trough) and `max`
    (at t = period / 2): min + (max - min) · (1 - cos 2πt/period) / 2."""

    name, keys = "diurnal", ("period", "min", "max")

    def rate(self, t: float) -> float:
        lo, hi = self.p["min"], self.p["max"]
        return lo + (hi - lo) * (1 - math.cos(2 * math.pi * t / self.p["period"])) / 2

    @property
    def peak(self) -> float:
        return max(self.p["min"], self.p["max"])


class Burst(RateShape):
    """On/off: `low` for `off` seconds, then `high` for `on` seconds, repeated."""

    name, keys = "burst", ("low", "high", "on", "off")

    def rate(self, t: float) -> float:
        phase = t % (self.p["on"] + self.p["off"])
        return self.p["low"] if phase < self.p["off"] else self.p["high"]

    @property
    def peak(self) -> float:
        """The highest rate the shape reaches: `on=0` never reaches `high`, `off=0` never
        `low`."""
        return max([self.p["low"]] * (self.p["off"] > 0) + [self.p["high"]] * (self.p["on"] > 0))


class Piecewise(RateShape):
    """Linear between points `T=RATE` (seconds=requests per second), e.g. `0=1,300=20,
    600=20,900=1`: a ramp up, a plateau and a ramp down; the shape ends at the last point."""

    name = "piecewise"

    def __init__(self, **params: float) -> None:
        super().__init__(**params)
        self.points = sorted((float(k), v) for k, v in params.items())
        self.end_s = self.points[-1][0]

    def rate(self, t: float) -> float:
        xs, ys = zip(*self.points, strict=True)
        return float(np.interp(t, xs, ys))

    @property
    def peak(self) -> float:
        return max(v for _, v in self.points)


SHAPES: dict[str, type[RateShape]] = {s.name: s for s in (Ramp, Diurnal, Burst, Piecewise)}


def parse_rate_shape(text: str) -> RateShape:
    """`diurnal:period=3600,min=2,max=20` → a RateShape (ValueError saying what is wrong)."""
    name, _, rest = text.partition(":")
    if name not in SHAPES:
        raise ValueError(f"unknown rate shape {name!r}; one of {', '.join(SHAPES)}")
    params: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = part.partition("=")
        if key.strip() in params:
            raise ValueError(f"rate shape {name}: {key.strip()}= given twice")
        try:
            params[key.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"rate shape {name}: bad term {part!r}, use KEY=NUMBER") from None
    cls = SHAPES[name]
    keys = getattr(cls, "keys", None)
    if keys is not None and set(params) != set(keys):
        raise ValueError(f"rate shape {name} takes {', '.join(f'{k}=' for k in keys)}")
    if cls is Piecewise:
        _check_points(params)
    if not all(math.isfinite(v) and v >= 0 for v in params.values()):
        raise ValueError(f"rate shape {name}: values must be finite numbers >= 0")
    if cls is Diurnal and params["min"] > params["max"]:
        raise ValueError("rate shape diurnal: min must be <= max")
    for key in ("over", "period"):
        if key in params and not params[key] > 0:
            raise ValueError(f"rate shape {name}: {key} must be > 0")
    if cls is Burst and not params["on"] + params["off"] > 0:
        raise ValueError("rate shape burst: on + off must be > 0")
    shape = cls(**params)
    if not shape.peak > 0:
        raise ValueError(f"rate shape {name}: the rate is 0 everywhere")
    return shape


def _check_points(params: dict[str, float]) -> None:
    """piecewise's `T=RATE` points: at least two, their times finite and increasing as
    written."""
    if len(params) < 2:
        raise ValueError("rate shape piecewise needs at least two T=RATE points")
    try:
        times = [float(k) for k in params]
    except ValueError:
        raise ValueError("rate shape piecewise: each point is T=RATE (seconds=requests per "
                         "second)") from None
    if not all(math.isfinite(t) for t in times):
        raise ValueError("rate shape piecewise: times must be finite")
    if any(b <= a for a, b in itertools.pairwise(times)):
        raise ValueError("rate shape piecewise: times must increase from one point to the next")


def shaped_arrival_times(shape: RateShape, rng: np.random.Generator, n: int | None = None,
                         duration_s: float | None = None) -> list[float]:
    """Send times of a non-homogeneous Poisson process with rate `shape.rate(t)`, by thinning
    (Lewis & Shedler 1979): candidates at the constant rate `shape.peak`, each kept with
    probability rate(t) / peak. Stops after `n` arrivals, at `duration_s`, or where the shape
    ends, whichever comes first (one of them must be given or finite). Without either bound,
    a shape whose rate falls to 0 for ever stops there; fewer than `n` arrivals by then is a
    ValueError (they would never come)."""
    horizon = min(x for x in (duration_s, shape.end_s, math.inf) if x is not None)
    zero = shape.zero_from if math.isinf(horizon) else None
    if zero is not None:
        horizon = zero
    if n is None and math.isinf(horizon):
        raise ValueError(f"rate shape {shape.name} goes on for ever: give a duration or a "
                         "number of requests")
    peak, t, out = shape.peak, 0.0, []
    while n is None or len(out) < n:
        gaps = rng.exponential(1.0 / peak, size=1024)
        keep = rng.random(size=1024)
        for gap, u in zip(gaps, keep, strict=True):
            t += float(gap)
            if t >= horizon:
                if zero is not None and n is not None and len(out) < n:
                    raise ValueError(
                        f"rate shape {shape.name}: the rate is 0 from {zero:g} s on, so only "
                        f"{len(out)} of the {n} requests arrive; ask for fewer requests or "
                        "give a duration")
                return out
            if u * peak < shape.rate(t):
                out.append(t)
                if n is not None and len(out) >= n:
                    return out
    return out
# --- end time-varying traffic --------------------------------------------------------------
