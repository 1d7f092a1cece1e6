"""The units of `doppelchip plan`'s search (sim/plan.py): what it prices and simulates.

A `Unit` is one sized config per pool of its serving mode — (config,) aggregated; (prefill,
decode) for P/D, alike or not (`units`: every pair of P/D shapes of one engine, model and
quantisation, Splitwise's heterogeneous pools among them; their KV must be interchangeable).
A P/D unit's prefill pool needs at least the prefill bound of its shape, its decode pool the
output bound of its own (`Unit.start`, from sim.plan_space's sizing); a candidate is a unit
times a replica count per pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sim.plan_space import Config, Sized


@dataclass(frozen=True)
class Unit:
    """One candidate shape of the search: `pools` holds a sized config per pool of `mode`
    (see the module docstring); a candidate is a unit times a replica count per pool."""

    mode: str
    pools: tuple[Sized, ...]

    @property
    def configs(self) -> tuple[Config, ...]:
        return tuple(s.config for s in self.pools)

    @property
    def name(self) -> str:
        """The config's name, or `prefill+decode` for a P/D unit of two shapes."""
        names = list(dict.fromkeys(c.name for c in self.configs))
        return "+".join(names)

    def usd_per_hour(self, counts: Sequence[int]) -> float:
        return sum(s.usd_per_hour * n for s, n in zip(self.pools, counts, strict=True))

    def chips(self, counts: Sequence[int]) -> int:
        return sum(s.chips * n for s, n in zip(self.pools, counts, strict=True))

    @property
    def start(self) -> tuple[int, ...]:
        """The first candidate: `min_replicas` (aggregated); for P/D the prefill bound of the
        prefill shape and the output bound of the decode shape (each pool does one half)."""
        if self.mode != "pd":
            return (self.pools[0].min_replicas,)
        prefill, decode = self.pools
        return (max(1, prefill.prefill_lb), max(1, decode.output_lb))


def units(kept: Sequence[Sized]) -> list[Unit]:
    """The search's units, in a stable order: each aggregated config alone; each P/D config
    as the prefill pool with every P/D config of its engine, model and quantisation as the
    decode pool (itself included: the pools alike)."""
    out = []
    pd = [s for s in kept if s.config.mode == "pd"]
    for s in kept:
        if s.config.mode != "pd":
            out.append(Unit(s.config.mode, (s,)))
            continue
        family = (s.config.engine, s.config.model, s.config.quant)
        out += [Unit("pd", (s, d)) for d in pd
                if (d.config.engine, d.config.model, d.config.quant) == family]
    return out
