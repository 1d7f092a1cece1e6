"""The metrics of the features of issue 13 that are not vLLM's, part of `schema.py`'s
set: P/D's KV transfers and held blocks, sleep mode's wake-up time (docs/PD.md), and the
failure injection's counters and gauges (docs/FAULTS.md), registered only on a deployment
with faults configured.

Why apart from `schema.py`: that module is vLLM's set and the device metrics every
deployment has; these belong to optional features and read on their own.
"""

from __future__ import annotations

from server.engine.faults import DEVICE_FAULTS, FAILURE_TYPES
from server.stats.layout import MetricDef

# --- P/D and sleep mode (issue 13) ------------------------------------------------------------
KV_TRANSFER_OUTCOMES = ("ok", "failed")


def pd_sleep_metrics() -> list[MetricDef]:
    """The KV transfers a decode pod pulled (docs/PD.md), the blocks a prefill pod holds for
    its decode side, and the emulated time waking up cost."""
    return [
        MetricDef("doppelchip_kv_transfers", "counter",
                  "KV-cache transfers pulled from a prefill pod (P/D), by outcome.",
                  label="outcome", values=KV_TRANSFER_OUTCOMES),
        MetricDef("doppelchip_kv_transfer_bytes", "counter",
                  "KV-cache bytes pulled from prefill pods (P/D)."),
        MetricDef("doppelchip_kv_transfer_seconds", "counter",
                  "Emulated seconds the KV transfers took on the link (P/D)."),
        MetricDef("doppelchip_kv_held_blocks", "gauge",
                  "KV blocks a prefill pod holds for decode pods to read (P/D)."),
        MetricDef("doppelchip_wake_seconds", "counter",
                  "Emulated seconds spent bringing weights back on wake-up (sleep mode)."),
    ]


# --- failure injection (issue 13): docs/FAULTS.md ---------------------------------------------
FAULT_REQUEST_METRICS = (
    MetricDef("doppelchip_failure_injections", "counter",
              "Generation requests refused by failure injection, by llm-d-inference-sim's "
              "failure type.", label="failure_type", values=FAILURE_TYPES),
    MetricDef("doppelchip_stream_cuts", "counter",
              "Streams cut mid-response by fault injection."),
)
FAULT_ENGINE_METRICS = (
    MetricDef("doppelchip_fault_events", "counter",
              "Device faults injected (occurrences started), by kind.", label="fault",
              values=DEVICE_FAULTS),
    MetricDef("doppelchip_fault_active", "gauge",
              "1 while a device fault is in force (hang: while steps are held back).",
              label="fault", values=("slowdown", "hang", "lost_chips")),
    MetricDef("doppelchip_slowdown_factor", "gauge",
              "Factor on every step's device time (1 when no slowdown is in force)."),
    MetricDef("doppelchip_hang_seconds", "counter",
              "Emulated seconds the engine made no progress with requests in flight (hang)."),
    MetricDef("doppelchip_kv_lost_blocks", "gauge",
              "KV blocks out of service with lost chips (counted as used)."),
)
