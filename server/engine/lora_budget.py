"""The adapters one step may run (vLLM v1's `max_loras` rule), for `Scheduler.schedule`.

Why it exists apart from the scheduler: it is one rule with one small state (the adapter ids a
step already runs), read only while waiting requests are admitted.
"""

from __future__ import annotations

from .request import Request
from .scheduler_config import ScheduledRequest


class LoraBudget:
    """The adapters one step runs, as vLLM v1's scheduler counts them
    (vllm/v1/core/sched/scheduler.py `scheduled_loras`): the running requests scheduled this
    step fix the first ones; a waiting request whose adapter would make more than `max_loras`
    distinct adapters is skipped (it keeps its place, later requests may be admitted);
    base-model requests (id 0) never count."""

    __slots__ = ("ids", "max_loras")

    def __init__(self, max_loras: int, ids: set[int]) -> None:
        self.max_loras, self.ids = max_loras, ids

    def admits(self, lora_id: int) -> bool:
        return lora_id == 0 or lora_id in self.ids or len(self.ids) < self.max_loras

    def add(self, lora_id: int) -> None:
        if lora_id:
            self.ids.add(lora_id)


def lora_budget(max_loras: int, running: list[Request],
                scheduled: dict[str, ScheduledRequest]) -> LoraBudget | None:
    if max_loras <= 0:
        return None
    return LoraBudget(max_loras, {r.lora_id for r in running
                                  if r.lora_id and r.request_id in scheduled})
