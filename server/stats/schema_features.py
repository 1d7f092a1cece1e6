"""The metrics of optional features, part of `schema.py`'s set: P/D's KV transfers and held
blocks, sleep mode's wake-up time, vLLM's NIXL connector's (docs/PD.md), registered only on a
pod with that connector, the failure injection's counters and gauges
(docs/FAULTS.md), registered only on a deployment with faults configured, and vLLM's CPU
offloading connector's (docs/KV_OFFLOAD.md), registered only with a CPU tier.

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


# --- vLLM's NIXL connector (P/D): docs/PD.md --------------------------------------------------
# vLLM 0.33.0: vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py (NixlPromMetrics),
# registered on every pod with a NixlConnector (either role, or a MultiConnector's part)
_NIXL_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0,
                      5.0)
NIXL_METRICS = (
    MetricDef("vllm:nixl_xfer_time_seconds", "histogram",
              "Histogram of transfer duration for NIXL KV Cache transfers.",
              _NIXL_TIME_BUCKETS[1:]),
    MetricDef("vllm:nixl_post_time_seconds", "histogram",
              "Histogram of transfer post time for NIXL KV Cache transfers.",
              _NIXL_TIME_BUCKETS),
    MetricDef("vllm:nixl_bytes_transferred", "histogram",
              "Histogram of bytes transferred per NIXL KV Cache transfers.",
              tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))),  # 2 KiB .. 8 GiB
    MetricDef("vllm:nixl_num_descriptors", "histogram",
              "Histogram of number of descriptors per NIXL  KV Cache transfers.",
              (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)),
    MetricDef("vllm:nixl_num_failed_transfers", "counter",
              "Number of failed NIXL KV Cache transfers, including handshake and notification "
              "failures. NOTE: KV expiry is tracked separately in "
              "vllm:nixl_num_kv_expired_reqs."),
    MetricDef("vllm:nixl_num_failed_notifications", "counter",
              "Number of failed NIXL KV Cache notifications. Retained for compatibility; these "
              "failures are also included in vllm:nixl_num_failed_transfers."),
    MetricDef("vllm:nixl_num_kv_expired_reqs", "counter",
              "Number of requests that had their KV expire. NOTE: This metric is tracked on "
              "the P instance."),
    MetricDef("vllm:nixl_num_notifications_after_expiry", "counter",
              "Number of completion notifications for requests that were no longer tracked, "
              "usually because their KV lease expired. The KV blocks may have been reused "
              "before the transfer finished. Counted per notification (one per remote rank), "
              "not per request."),
)


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


# --- vLLM's CPU KV offloading: docs/KV_OFFLOAD.md -----------------------------------------------
# vLLM 0.33.0: vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py (the flat
# transfer families, their deprecated transfer_type forms, TRANSFER_SIZE_BUCKETS) and
# vllm/v1/kv_offload/cpu/spec.py (the CPU tier's gauges and allocation histogram)
TRANSFER_TYPES = ("CPU_to_GPU", "GPU_to_CPU")
TRANSFER_SIZE_BUCKETS = (1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)
CPU_ALLOCATION_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)
OFFLOAD_CONFIG_INFO = "vllm:kv_offload_config_info"
OFFLOAD_CONFIG_INFO_HELP = (
    "Static configuration of the KV offload managers of this engine instance. The configured "
    "offloading spec declares the label names, and each manager fills the values, so a series "
    "appears from the first scheduler step of its engine. A manager reports one series for "
    "each configuration it holds, and a label of its own tells the series apart. Each engine "
    "reports its own configuration, not the instance total.")
OFFLOAD_METRICS = (
    MetricDef("vllm:kv_offload_load_bytes", "counter",
              "Total bytes loaded from offload storage to GPU."),
    MetricDef("vllm:kv_offload_load_time", "counter",
              "Total load time from offload storage to GPU, in seconds."),
    MetricDef("vllm:kv_offload_load_size", "histogram",
              "Histogram of KV offload load operation size, in bytes.", TRANSFER_SIZE_BUCKETS),
    MetricDef("vllm:kv_offload_store_bytes", "counter",
              "Total bytes stored from GPU to offload storage."),
    MetricDef("vllm:kv_offload_store_time", "counter",
              "Total store time from GPU to offload storage, in seconds."),
    MetricDef("vllm:kv_offload_store_size", "histogram",
              "Histogram of KV offload store operation size, in bytes.", TRANSFER_SIZE_BUCKETS),
    MetricDef("vllm:kv_offload_allocation_failure", "counter",
              "Number of KV offload store allocation attempts that failed."),
    MetricDef("vllm:kv_offload_total_bytes", "counter",
              "Number of bytes offloaded by KV connector", label="transfer_type",
              values=TRANSFER_TYPES),
    MetricDef("vllm:kv_offload_total_time", "counter",
              "Total time measured by all KV offloading operations", label="transfer_type",
              values=TRANSFER_TYPES),
    MetricDef("vllm:kv_offload_size", "histogram",
              "Histogram of KV offload transfer size, in bytes.", TRANSFER_SIZE_BUCKETS,
              label="transfer_type", values=TRANSFER_TYPES),
    MetricDef("vllm:kv_offload_cpu_cache_usage_perc", "gauge",
              "Fraction of CPU KV-cache space currently pinned by active transfers (0.0 = "
              "idle, 1.0 = saturated). Sustained high values indicate transfers (stores or "
              "promotions) may be dropped due to insufficient capacity."),
    MetricDef("vllm:kv_offload_cpu_cache_write_usage_perc", "gauge",
              "Fraction of CPU KV-cache space currently pinned by in-flight stores that have "
              "not yet completed (0.0 = idle, 1.0 = saturated)."),
    MetricDef("vllm:kv_offload_cpu_cache_read_usage_perc", "gauge",
              "Fraction of CPU KV-cache space currently pinned by in-flight loads that have "
              "not yet completed (0.0 = idle, 1.0 = saturated)."),
    MetricDef("vllm:kv_offload_cpu_allocation_size", "histogram",
              "Histogram of the number of CPU chunks requested by each KV offload "
              "prepare_store call.", CPU_ALLOCATION_BUCKETS),
)
