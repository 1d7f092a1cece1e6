"""Efficiency factors of an engine on a chip class (fitted in ``devices.calibration``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Factors:
    """What share of the roofline an engine reaches on a chip class, and its fixed overhead.

    ``bw_eff``: fraction of peak memory bandwidth when streaming weights and KV.
    ``flop_eff``: fraction of peak FLOP/s (of the engine's compute dtype) in large matmuls.
    ``kernel_s``: fixed seconds per kernel launch / program stage (launch, sync, scheduling);
    a step pays ``layers × kernels_per_layer × kernel_s`` whatever the batch size.
    ``origin`` says how each was set (fitted from which points, or borrowed from where).
    """

    bw_eff: float
    flop_eff: float
    kernel_s: float
    origin: str = ""


UNIT = Factors(bw_eff=1.0, flop_eff=1.0, kernel_s=0.0, origin="unit (roofline only)")
