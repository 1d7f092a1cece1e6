"""Efficiency factors of an engine on a chip class, and where each came from.

Why a record of provenance: a factor fitted from three measurements, one borrowed from another
engine and one that is a stated assumption look the same as numbers; capacity planners need to
know which predictions rest on what. ``devices.calibration`` fills both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FACTOR_NAMES = ("bw_eff", "flop_eff", "kernel_s")


@dataclass(frozen=True)
class Provenance:
    """How one factor was set.

    ``kind``: 'fitted' (solved from ``points`` of this group), 'borrowed' (copied from the
    group ``source``, itself fitted from ``points``), 'assumption' (``note`` says which) or
    'default' (nothing to borrow: the roofline's 1.0 / 0 s).
    """

    kind: str
    points: tuple[str, ...] = ()
    source: str = ""
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": self.kind}
        if self.points:
            out["points"] = list(self.points)
            out["n_points"] = len(self.points)
        if self.source:
            out["from"] = self.source
        if self.note:
            out["note"] = self.note
        return out

    def describe(self) -> str:
        if self.kind == "fitted":
            return f"fitted from {len(self.points)} point(s): {', '.join(self.points)}"
        if self.kind == "borrowed":
            return f"borrowed from {self.source}" + (f" ({self.note})" if self.note else "")
        return f"{self.kind}: {self.note}" if self.note else self.kind


@dataclass(frozen=True)
class Factors:
    """What share of the roofline an engine reaches on a chip class, and its fixed overhead.

    ``bw_eff``: fraction of peak memory bandwidth when streaming weights and KV.
    ``flop_eff``: fraction of peak FLOP/s (of the engine's compute path) in large matmuls.
    ``kernel_s``: fixed seconds per kernel launch / program stage (launch, sync, scheduling);
    a step pays ``layers × kernels_per_layer × kernel_s`` whatever the batch size.
    ``provenance``: factor name -> :class:`Provenance`.
    """

    bw_eff: float
    flop_eff: float
    kernel_s: float
    provenance: tuple[tuple[str, Provenance], ...] = field(default=(), compare=False)

    @property
    def origin(self) -> str:
        """One line per factor saying where it came from."""
        return "; ".join(f"{name} {p.describe()}" for name, p in self.provenance)

    def provenance_of(self, name: str) -> Provenance:
        return dict(self.provenance).get(name, Provenance("default"))


UNIT = Factors(bw_eff=1.0, flop_eff=1.0, kernel_s=0.0,
               provenance=tuple((n, Provenance("assumption", note="unit roofline"))
                                for n in FACTOR_NAMES))
