"""The emulated timeline, mapped onto wall time, shared by every process of one server.

Emulated seconds run at `1 / time_scale` × wall time (time_scale 1.0 = true speed; 0.01 makes
emulated seconds pass 100× faster) from a common origin `wall0` (a `time.monotonic()` value,
which is system-wide on Linux): an engine core stamps token times on it and a front end
stamps arrivals and measures delivery lag on it, and the two agree.
"""

from __future__ import annotations

import time


class Timeline:
    def __init__(self, wall0: float, time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.wall0, self.time_scale = wall0, time_scale

    def now(self) -> float:
        """Emulated seconds since the origin."""
        return (time.monotonic() - self.wall0) / self.time_scale

    def wall_until(self, t: float) -> float:
        """Wall seconds from now until emulated time `t` (negative: `t` has passed)."""
        return (t - self.now()) * self.time_scale
