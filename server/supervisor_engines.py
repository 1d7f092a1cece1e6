"""The supervisor's record of one engine-core process, and what a crash looks like.

A crash marks the deployment FAILED in its stats file (front ends read the state and the
message from there, and `ListDeployments` says why) until the restarted engine reports
COMPILING, then READY. Restarts back off: `backoff_s` after a first crash, doubling for each
further crash within a minute, at most a minute.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field

from server.engine.options import EngineOptions
from server.ipc import messages as m
from server.ipc.deployment import DeploymentInfo
from server.ipc.paths import RunDir
from server.stats.layout import Layout
from server.stats.schema import STATE_CODES, engine_metrics
from server.stats.shm import StatsFile

CRASH_WINDOW_S = 60.0
MAX_BACKOFF_S = 60.0


def crash_message(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


@dataclass
class EngineSlot:
    deployment: int
    rank: int
    options: EngineOptions
    epoch: int = 0
    process: object | None = None
    info: DeploymentInfo | None = None
    pid: int = 0
    crashes: list[float] = field(default_factory=list)

    def hello(self, msg: m.EngineHello) -> None:
        self.info, self.pid = msg.info, msg.pid

    @property
    def permanent_failure(self) -> bool:
        """Could not be placed: restarting would fail the same way."""
        return self.info is not None and not self.info.placed

    def next_backoff(self, base_s: float) -> float:
        now = time.monotonic()
        self.crashes = [t for t in self.crashes if now - t < CRASH_WINDOW_S] + [now]
        return min(MAX_BACKOFF_S, base_s * 2 ** (len(self.crashes) - 1))

    def mark_failed(self, run_dir: RunDir, info: DeploymentInfo, message: str) -> None:
        """Write FAILED and `message` where the front ends read the deployment's state (the
        engine process is gone, so nothing else writes this file now)."""
        layout = Layout(engine_metrics(info))
        f = StatsFile(run_dir.engine_stats(self.deployment, self.rank), layout.size,
                      create=True)
        f.begin()
        f.values[layout.slot("_state")] = STATE_CODES.index("failed")
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                     "doppelchip_realtime_lag_seconds", "_kv_used"):
            f.values[layout.slot(name)] = 0
        f.values[layout.slot("_kv_free")] = info.capacity.kv_blocks_total
        f.set_text(message)
        f.end()
        f.close()
