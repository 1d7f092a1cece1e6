"""What limits a saturated run, read from the engine's own counters in its summary (virtual
time: `sim.simulation`), never guessed from latencies.

The order is the order in which one limit hides the others: a chip that spends its time
compiling never fills its KV cache; a full KV cache preempts before the batch seats run out;
with seats free and KV to spare, the steps themselves (the roofline) are the limit.
"""

from __future__ import annotations

from typing import Any

COMPILE_SHARE = 0.1  # compile stalls are the bottleneck above 10% of the emulated time
KV_FULL = 0.95  # KV capacity is the bottleneck when the peak usage reaches 95% (or preempts)


def bottleneck(summary: dict[str, Any]) -> dict[str, Any] | None:
    """{"kind": compile-stalls|kv-capacity|queueing|compute, "why": counters in words} for a
    summary with the engine's counters, or None (a gRPC target's summary has none)."""
    if "steps" not in summary:
        return None
    emulated = summary.get("emulated_s") or summary.get("duration_s") or 0.0
    stall = summary.get("compile_stall_s", 0.0)
    if emulated and stall / emulated > COMPILE_SHARE:
        return {"kind": "compile-stalls",
                "why": f"{stall:.1f} s of {emulated:.1f} s compiling "
                       f"({summary.get('compiles', 0)} compiles)"}
    kv_peak, preempt = summary.get("kv_usage_peak", 0.0), summary.get("preemptions", 0)
    if kv_peak >= KV_FULL or preempt:
        return {"kind": "kv-capacity",
                "why": f"KV cache peak {kv_peak:.0%}, {preempt} preemptions"}
    seats, peak = summary.get("max_num_seqs"), summary.get("peak_running", 0)
    if seats and peak >= seats:
        return {"kind": "queueing",
                "why": f"every batch seat taken (max_num_seqs {seats}), requests wait in the "
                       f"queue; KV cache peak {kv_peak:.0%}"}
    return {"kind": "compute",
            "why": f"batch seats free (peak {peak} of {seats}), KV cache peak {kv_peak:.0%}: "
                   "the steps themselves (prefill and decode compute) are the limit"}
