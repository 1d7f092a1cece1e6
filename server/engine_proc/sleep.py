"""Sleep mode (vLLM's `/sleep`, `/wake_up`, `/is_sleeping`) on the engine core: which memory
is gone, what waking costs on the emulated timeline, what the metric says.

Why it exists: RL trainers and autoscalers put idle vLLM engines to sleep to free the GPU and
wake them later; they measure (and route around) the wake-up time. vLLM's semantics,
followed from vllm/v1/engine/core.py (`sleep`, `pause_scheduler`, `wake_up`) and
vllm/v1/metrics/loggers.py (`record_sleep_state`) as of v0.26, checked at v0.33.0:

- level 0 pauses scheduling; level 1 offloads the weights to host memory and discards the KV
  cache; level 2 discards both. Level >= 1 resets the prefix cache.
- mode "abort" (default) aborts the requests in flight; "wait" lets them finish first;
  "keep" keeps them (their KV is discarded at level >= 1, so they are recomputed — a
  preemption — after waking). Requests that arrive while asleep are accepted and queued
  (PAUSED_NEW), and run once the engine is awake.
- wake_up(tags): tags among weights, kv_cache, scheduling (none: all). The engine is
  asleep until its weights and KV cache are back; then scheduling resumes too (vLLM 0.33.0:
  `fully_awake` resumes the scheduler). release_kv_cache_memory (after a completed pause)
  puts the KV cache alone to sleep.
- `vllm:engine_sleep_state{sleep_state=awake|weights_offloaded|discard_all}`: awake 1 when
  awake; asleep, awake 0 and weights_offloaded 1 at level 1, discard_all 1 at level 2.

Waking the weights costs their bytes per chip (every chip loads its share at once) over the
chip's host link after level 1, from storage (the chip's SSD, no faster than the host link)
after level 2: `devices.transfer`. Unified memory (no host link) wakes at no cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from devices import Placement
from devices.transfer import host_link, storage_link, transfer_seconds

LEVELS = (0, 1, 2)
MODES = ("abort", "wait", "keep")
TAGS = ("weights", "kv_cache", "scheduling")


@dataclass
class SleepState:
    level: int | None = None  # None: awake
    asleep_tags: set[str] = field(default_factory=set)
    wake_seconds_total: float = 0.0

    @property
    def sleeping(self) -> bool:
        return self.level is not None

    def sleep(self, level: int) -> None:
        self.level = level
        self.asleep_tags = {"scheduling"} if level == 0 else {"weights", "kv_cache"}

    @property
    def memory_asleep(self) -> bool:
        """Weights or KV cache are not resident (vLLM's executor `is_sleeping`)."""
        return bool(self.asleep_tags - {"scheduling"})

    def release_kv(self) -> None:
        """vLLM 0.33.0's release_kv_cache_memory: the KV cache's memory is discarded until a
        wake-up brings tag kv_cache back (vllm:engine_sleep_state all 0, as vLLM records it)."""
        self.level = 0 if self.level is None else self.level
        self.asleep_tags.add("kv_cache")

    def wake(self, tags: tuple[str, ...], placement: Placement) -> float:
        """Wake `tags` (all when empty); the emulated seconds it costs. Once no memory is
        asleep the engine is awake, scheduling too (vLLM: `fully_awake` resumes the
        scheduler)."""
        if self.level is None:
            return 0.0
        woken = set(tags) & self.asleep_tags if tags else set(self.asleep_tags)
        seconds = wake_seconds(placement, self.level) if "weights" in woken else 0.0
        self.asleep_tags -= woken
        if not self.memory_asleep:
            self.asleep_tags.clear()
            self.level = None
        self.wake_seconds_total += seconds
        return seconds

    def metric(self) -> dict[str, float]:
        """vllm:engine_sleep_state's three values."""
        lvl = self.level
        return {"awake": float(lvl is None), "weights_offloaded": float(lvl == 1),
                "discard_all": float(lvl == 2)}


def weight_bytes_per_chip(placement: Placement) -> float:
    return sum(b for _, b in placement.weight_bytes) / max(1, placement.chips)


def wake_seconds(placement: Placement, level: int) -> float:
    """Bringing the weights back after sleeping at `level`: host memory (1) or storage (2)."""
    if level == 0:
        return 0.0
    link = host_link(placement.chip) if level == 1 else storage_link(placement.chip)
    if link is None:
        return 0.0
    return transfer_seconds(weight_bytes_per_chip(placement), link)
