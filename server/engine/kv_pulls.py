"""A decode pod's pulls of remotely prefilled KV, as vLLM 0.33.0's scheduler drives its NIXL
connector (P/D).

Why it exists: vLLM starts a remote prefill's KV load only when the scheduler admits the
request — a seat under `max_num_seqs`, device blocks for its prompt — and the load holds those
blocks until it lands (`WAITING_FOR_REMOTE_KVS`). On a saturated decode pod requests therefore
wait with their KV still on the prefill pod, which keeps holding it. `RemotePulls` is the
loads' bookkeeping, the counterpart over the P/D link of the CPU tier's `HostKvTier`; the
scheduler (`kv_loads.KvLoads`) is its one caller, and the connector
(`server/engine_proc/kv_connector.py`) supplies the link's timing and hears when a pull ends.

A pull's life:
1. The prefill pod answered the connector's read: the request joins the scheduler expecting
   its prompt's KV (`expect`), counted `waiting_to_start`.
2. Admitted, it allocates its prompt's blocks and the pull starts at the step's start, after
   the pulls before it on the link (`start`, the connector's `timing`).
3. At the first step starting at or after its end it lands as a CPU-tier load does (`landed`);
   the connector is told (`on_end`) and notifies the prefill pod, which frees its blocks.
   A request that ends before (`finish`) tells the connector too.
"""

from __future__ import annotations

from collections.abc import Callable

from .kv_offload import Load
from .request import Request


class RemotePulls:
    """`expect`, `start`, `landed`, `finish` (see the module docstring)."""

    def __init__(self, timing: Callable[[str, int, float], float],
                 on_end: Callable[[str, bool], None]) -> None:
        """`timing(request id, tokens, start)`: when the pull ends on the link; `on_end(request
        id, landed)`: the pull is over (landed, or its request ended)."""
        self.timing, self.on_end = timing, on_end
        self.expected: dict[str, int] = {}  # request id -> prompt tokens the prefill pod holds
        self.loads: dict[str, Load] = {}

    def expect(self, request_id: str, num_tokens: int) -> None:
        self.expected[request_id] = num_tokens

    def start(self, req: Request, device_hit: int, now: float) -> Load:
        """Pull the expected tokens past the device's own `device_hit`, starting at `now`."""
        n = max(0, self.expected.pop(req.request_id) - device_hit)
        load = Load(req, n, self.timing(req.request_id, n, now), None)
        self.loads[req.request_id] = load
        return load

    def landed(self, now: float) -> list[Load]:
        """The pulls that ended by `now`, in the order they started (the scheduler orders
        every loader's by their end)."""
        done = [ld for ld in self.loads.values() if ld.ready_at <= now]
        for ld in done:
            del self.loads[ld.req.request_id]
            self.on_end(ld.req.request_id, True)
        return done

    def finish(self, request_id: str) -> None:
        """The request ended before its pull landed (or before it started)."""
        if (self.loads.pop(request_id, None) is not None
                or self.expected.pop(request_id, None) is not None):
            self.on_end(request_id, False)

    def next_ready(self) -> float | None:
        return min((ld.ready_at for ld in self.loads.values()), default=None)
