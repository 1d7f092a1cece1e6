"""Clocks: the emulated timeline mapped onto wall time.

`RealClock` runs the emulated timeline at `time_scale` × wall time (1.0 = true speed; 0.01 makes
emulated seconds pass 100× faster). A step that costs `c` emulated seconds ends at the absolute
deadline `t_start + c`, so the engine's own Python overhead does not accumulate; when the host
cannot keep up, `lag()` says by how much the wall clock is behind the emulated timeline.
"""

from __future__ import annotations

import asyncio
import time


class RealClock:
    def __init__(self, time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.time_scale = time_scale
        self._wall0 = time.monotonic()

    def now(self) -> float:
        """Emulated seconds since the clock was created."""
        return (time.monotonic() - self._wall0) / self.time_scale

    async def sleep_until(self, t: float) -> float:
        """Sleep until emulated time `t`; return the lag (emulated seconds late, >= 0)."""
        delay = t - self.now()
        # Always yield: a zero-cost step must not starve the handlers sharing this loop.
        await asyncio.sleep(max(0.0, delay * self.time_scale))
        return max(0.0, self.now() - t)
