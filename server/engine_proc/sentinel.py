"""vLLM 0.34.0's fault tolerance in the engine-core process (`--enable-fault-tolerance`): the
state of vLLM's `EngineCoreSentinel` (`vllm/v1/fault_tolerance/engine_core_sentinel.py`, read,
not copied), as the engine loop drives it: the fault from `faults.py` (an injected crash), the
instructions from `loop_controls.py`; `fault_tolerance_problem` is what `serve` refuses.

What vLLM does, and what is emulated:
- A fault in the engine's busy loop (here: an injected crash, `--fault-crash`) does not end the
  process: every request is aborted, the status goes to `diagnosing`, then `unhealthy` with
  `fault_info` (the exception's type name: an injected crash is a `RuntimeError`, as a CUDA or
  NCCL error surfaces in PyTorch), and the engine waits for an instruction.
- `retry` (status unhealthy only) recovers: the engine is `healthy` again. vLLM re-creates its
  communication groups; that takes no emulated time here (no public figure).
- `scale_down` (params `removed_dp_ranks`, with data parallelism) marks those ranks dead, after
  vLLM's checks of the ranks (and `dp_master_ip`/`dp_store_port` when the lowest live rank,
  the store's master, is removed), then `healthy`. The ranks' rendezvous over the data-parallel
  group is not emulated: each pod recovers on its own.
- Other instructions, or any instruction while not `unhealthy`, are refused with vLLM's reason.
- No instruction within `engine_recovery_timeout_sec` (emulated seconds here): the original
  error is raised, and the engine process dies (the supervisor's crash path).
Each status change is a push (`pushes` counts them): the front end's cached entry is replaced
by each push, as vLLM's client replaces it (its `ft_state` decorations go with it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.config import FleetConfig

STATUSES = ("healthy", "diagnosing", "unhealthy", "dead")  # vLLM's EngineStatusType, lower
INSTRUCTIONS = ("retry", "scale_down")  # vLLM's ALLOWED_FT_INSTRUCTIONS
FAULT_INFO = "RuntimeError"  # what an injected crash raises in the busy loop


@dataclass
class Sentinel:
    """One engine core's fault-tolerance state (its loop is the one writer)."""

    engine_index: int  # the data-parallel rank (vLLM's engine_index)
    dp_size: int
    timeout_s: float  # vLLM's engine_recovery_timeout_sec, on the emulated timeline
    status: str = "healthy"
    fault_info: str | None = None
    deadline: float | None = None  # emulated time the recovery must come by
    pushes: int = 0
    dead_dp_ranks: set[int] = field(default_factory=set)

    def on_fault(self, now: float) -> None:
        """The busy loop raised: diagnosing, then unhealthy, waiting until `now + timeout`."""
        self.fault_info, self.deadline = FAULT_INFO, now + self.timeout_s
        self._push("diagnosing")
        self._push("unhealthy")

    def expired(self, now: float) -> bool:
        """No recovery came in time: the engine must die with its original error."""
        return self.deadline is not None and now >= self.deadline

    def handle(self, instruction: str, params_json: str) -> str | None:
        """Apply one instruction: None when it succeeded, else vLLM's reason."""
        i = self.engine_index
        if instruction not in INSTRUCTIONS:
            return f"[FT] Rejecting unknown instruction '{instruction}' on engine {i}"
        if self.status != "unhealthy":
            return (f"[FT] Rejecting {instruction} on engine {i}: status is "
                    f"{self.status.upper()}")
        params = json.loads(params_json or "{}")
        if instruction == "scale_down" and (problem := self._scale_down(params)) is not None:
            return problem
        self.deadline, self.fault_info = None, None
        self._push("healthy")
        return None

    def _scale_down(self, params: dict) -> str | None:
        """vLLM's checks of `removed_dp_ranks`; the dead set committed when they pass."""
        if self.dp_size == 1:
            return ("scale_down requires data_parallel_size > 1; a dp=1 engine has no ranks "
                    "to remove")
        if "removed_dp_ranks" not in params:
            return "'removed_dp_ranks'"  # (vLLM's KeyError, as its reason reads)
        removed = params["removed_dp_ranks"]
        if not isinstance(removed, list) or not all(isinstance(r, int) for r in removed):
            return "'removed_dp_ranks' must be a list of data-parallel ranks"
        ranks, every = set(removed), set(range(self.dp_size))
        newly = ranks - self.dead_dp_ranks
        if (not ranks or not ranks <= every or self.engine_index in ranks
                or every <= self.dead_dp_ranks | newly or not newly):
            return (f"Invalid removed_dp_ranks {sorted(ranks)} for engine {self.engine_index} "
                    f"(dp_rank={self.engine_index}, dead_dp_ranks={sorted(self.dead_dp_ranks)})")
        master = min(every - self.dead_dp_ranks)
        if master in newly and (params.get("dp_store_port") is None
                                or params.get("dp_master_ip") is None):
            return (f"dp_store_port and dp_master_ip required when the store master (rank "
                    f"{master}) is removed")
        self.dead_dp_ranks |= newly
        return None

    def publish(self, stats) -> None:
        """Write the status where the front ends read it (`EngineStats.fault_status`)."""
        stats.fault_status(STATUSES.index(self.status), self.pushes)

    def _push(self, status: str) -> None:
        self.status = status
        self.pushes += 1


def fault_tolerance_problem(fleet: FleetConfig) -> str:
    """Why a deployment's fault tolerance cannot be served ("" when it can): vLLM 0.34.0's is a
    pod's (one engine behind one API server), and its config must be what vLLM accepts."""
    for i, d in enumerate(fleet.deployments):
        try:
            on = d.recovery_timeout_s() is not None
        except ValueError as e:
            return f"deployments[{i}]: {e}"
        if on and not fleet.server.pod:
            return (f"deployments[{i}]: enable_fault_tolerance needs pod mode (one deployment: "
                    "--deployment NAME, or --chip --engine --model --quant)")
        if on and fleet.server.http_api != "vllm":
            return (f"deployments[{i}]: enable_fault_tolerance is vLLM's (its routes are on a "
                    f"vLLM pod's HTTP port), not on an --http-api {fleet.server.http_api} pod")
        if on and fleet.server.api_server_count > 1:  # vLLM's words (ParallelConfig)
            return ("Fault tolerance requires a single API server process (--api-server-count="
                    f"1), but got {fleet.server.api_server_count}. The FT system assumes one "
                    "AsyncMPClient manages all engines.")
    return ""
