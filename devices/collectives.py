"""Collective communication time, sized by the message: all-reduce, all-gather, all-to-all.

The latency model is NCCL's own tuning model (``src/graph/tuning.cc``): a collective costs a
base latency plus a per-step latency for each of its ring steps — 2(n−1) steps for an
all-reduce, n−1 for an all-gather or an all-to-all — and moves ``(n−1)/n`` of its data per
rank (×2 for an all-reduce: reduce-scatter then all-gather) over the link's one-direction
bandwidth. Ranks spread over several scale-up domains (8-GPU HGX boxes, a 72-GPU NVL72 rack)
pay the scale-out network's latency and bandwidth for the steps that leave the domain.
The chip's catalogue entry carries the figures (``collective_base_s``, ``hop_latency_s``,
``link_bw_bps``, ``domain_size``, ``scaleout_*``), each with its source.
"""

from __future__ import annotations

from dataclasses import dataclass

from devices.specs import ChipSpec


@dataclass(frozen=True)
class Link:
    """The fabric a group of ``n`` ranks talks over (per rank, one direction)."""

    n: int
    base_s: float
    step_s: float
    bw: float  # bytes/s per rank inside the domain
    out_steps_frac: float  # share of ring steps that cross the scale-out network
    out_step_s: float
    out_bw: float

    def _time(self, steps: int, data: float) -> float:
        """``steps`` ring steps moving ``data`` bytes per rank in total."""
        if self.n <= 1:
            return 0.0
        f = self.out_steps_frac
        lat = self.base_s + steps * ((1 - f) * self.step_s + f * self.out_step_s)
        bw = self.bw if f == 0 else min(self.bw, self.out_bw or self.bw)
        return lat + data / bw

    def all_reduce(self, nbytes: float) -> float:
        n = self.n
        return self._time(2 * (n - 1), 2 * (n - 1) / n * nbytes)

    def all_gather(self, nbytes_total: float) -> float:
        n = self.n
        return self._time(n - 1, (n - 1) / n * nbytes_total)

    def all_to_all(self, nbytes_per_rank: float) -> float:
        n = self.n
        return self._time(n - 1, (n - 1) / n * nbytes_per_rank)

    # the same, split into a fixed part and a part per byte (the cost model precomputes)
    def all_reduce_parts(self) -> tuple[float, float]:
        return self._parts(2 * (self.n - 1), 2 * (self.n - 1) / max(1, self.n))

    def all_to_all_parts(self) -> tuple[float, float]:
        return self._parts(self.n - 1, (self.n - 1) / max(1, self.n))

    def _parts(self, steps: int, data_per_byte: float) -> tuple[float, float]:
        fixed = self._time(steps, 0.0)
        return fixed, (self._time(steps, data_per_byte * 1e9) - fixed) / 1e9


def link_for(chip: ChipSpec, n: int) -> Link:
    """The link ``n`` ranks of ``chip`` use: within one scale-up domain, or spanning several."""
    domain = max(1, chip.domain_size)
    out = 0.0
    if n > domain:
        # a ring over d domains crosses the network on d of its n steps per pass
        out = min(1.0, (n // domain) / n)
    return Link(n=n, base_s=chip.collective_base_s, step_s=chip.hop_latency_s,
                bw=chip.link_bw_bps or 1.0, out_steps_frac=out,
                out_step_s=chip.scaleout_latency_s, out_bw=chip.scaleout_bw_bps)
