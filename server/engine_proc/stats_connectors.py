"""The engine's metrics of KV connectors and sleep mode, a mixin of `EngineStats`: vLLM's
sleep state, the connectors' prefix-cache counters, P/D's transfers and held blocks, vLLM's
NIXL connector's families (NixlPromMetrics) and its CPU offloading connector's.

Why apart from `stats.py`: these belong to optional features (docs/PD.md, docs/KV_OFFLOAD.md),
each written from its connector's own counters once per step; `stats.py` keeps the scheduler's
and the device's. `EngineStats` stays the one writer of the stats file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from server.engine.core import EngineCore
from server.ipc.deployment import DeploymentInfo
from server.stats.layout import HistogramWriter, Layout
from server.stats.schema_features import NIXL_METRICS
from server.stats.shm import StatsFile

if TYPE_CHECKING:
    from server.engine_proc.kv_connector import NixlConnector
    from server.engine_proc.sleep import SleepState


class ConnectorStats:
    """`pd_sleep` and its parts (see the module docstring)."""

    a: np.ndarray
    file: StatsFile
    slot: Callable[..., int]  # Layout.slot

    def _init_connectors(self, info: DeploymentInfo, layout: Layout) -> None:
        self._pd_seen = (0, 0, 0)  # scheduler's external prefix queries, hits, host hits
        self._offload_seen: tuple[float, ...] = (0,) * 5  # CPU tier: loads B/s, stores B/s,
        #                                                   allocation failures
        self._offload_hist = {(name, value): HistogramWriter(self.a, layout, name, value)
                              for name, value in (
                                  ("vllm:kv_offload_load_size", None),
                                  ("vllm:kv_offload_store_size", None),
                                  ("vllm:kv_offload_size", "CPU_to_GPU"),
                                  ("vllm:kv_offload_size", "GPU_to_CPU"),
                                  ("vllm:kv_offload_cpu_allocation_size", None))
                              } if info.kv_offload_blocks else {}
        self._conn_seen: tuple[float, ...] = (0.0,) * 5  # wake s, transfers ok/failed, B, s
        self._nixl_seen = (0, 0, 0)  # the NIXL connector's failures, expiries, late reads
        self._nixl_hist = tuple(HistogramWriter(self.a, layout, d.name) for d in NIXL_METRICS
                                if d.kind == "histogram") if info.nixl else ()

    def pd_sleep(self, core: EngineCore, sleep: SleepState, connector: NixlConnector | None
                 ) -> None:
        """vllm:engine_sleep_state as vLLM records it, the connector's prefix-cache counters
        (vllm:external_prefix_cache_*, prompt_tokens_cached_by_source p2p) and transfers."""
        a, slot, st = self.a, self.slot, core.scheduler.stats
        self.file.begin()
        for state, value in sleep.metric().items():
            a[slot("vllm:engine_sleep_state", state)] = value
        seen = (st.external_prefix_cache_queries, st.external_prefix_cache_hits,
                st.host_prefix_cache_hits)
        before = self._pd_seen
        a[slot("vllm:external_prefix_cache_queries")] += seen[0] - before[0]
        a[slot("vllm:external_prefix_cache_hits")] += seen[1] - before[1]
        host = seen[2] - before[2]  # loaded from the CPU tier; the rest came from a prefill pod
        a[slot("vllm:prompt_tokens_cached_by_source", "p2p")] += seen[1] - before[1] - host
        a[slot("vllm:prompt_tokens_cached_by_source", "host")] += host
        self._pd_seen = seen
        if self._offload_hist:
            self._offload(core)
        a[slot("doppelchip_kv_held_blocks")] = sum(len(b) for b, _ in
                                                   core.scheduler.held.values())
        now = (sleep.wake_seconds_total, *((connector.transfers, connector.failures,
                                            connector.bytes, connector.seconds)
                                           if connector is not None else (0, 0, 0.0, 0.0)))
        for (name, value), n, before in zip(
                (("doppelchip_wake_seconds", None), ("doppelchip_kv_transfers", "ok"),
                 ("doppelchip_kv_transfers", "failed"), ("doppelchip_kv_transfer_bytes", None),
                 ("doppelchip_kv_transfer_seconds", None)), now, self._conn_seen, strict=True):
            a[slot(name, value)] += n - before  # counters continue across engine restarts
        self._conn_seen = now
        if self._nixl_hist:
            self._nixl(connector)
        self.file.end()

    def _offload(self, core: EngineCore) -> None:
        """vLLM's offloading connector metrics from the CPU tier's counters (deltas; the
        transfer sizes observed once each, drained from the tier's lists)."""
        tier = core.scheduler.offload
        assert tier is not None
        st, a, slot, hist = tier.stats, self.a, self.slot, self._offload_hist
        now = (st.load_bytes, st.load_seconds, st.store_bytes, st.store_seconds,
               st.allocation_failures)
        d = [x - y for x, y in zip(now, self._offload_seen, strict=True)]
        self._offload_seen = now
        for name, i in (("vllm:kv_offload_load_bytes", 0), ("vllm:kv_offload_load_time", 1),
                        ("vllm:kv_offload_store_bytes", 2), ("vllm:kv_offload_store_time", 3),
                        ("vllm:kv_offload_allocation_failure", 4)):
            a[slot(name)] += d[i]
        for name, i, j in (("vllm:kv_offload_total_bytes", 0, 2),
                           ("vllm:kv_offload_total_time", 1, 3)):
            a[slot(name, "CPU_to_GPU")] += d[i]
            a[slot(name, "GPU_to_CPU")] += d[j]
        for sizes, name, kind in ((st.load_sizes, "vllm:kv_offload_load_size", "CPU_to_GPU"),
                                  (st.store_sizes, "vllm:kv_offload_store_size", "GPU_to_CPU")):
            hist[(name, None)].observe_many(sizes)
            hist[("vllm:kv_offload_size", kind)].observe_many(sizes)  # (deprecated)
            sizes.clear()
        hist[("vllm:kv_offload_cpu_allocation_size", None)].observe_many(st.store_chunks)
        st.store_chunks.clear()
        read = tier.loading_blocks / tier.num_blocks  # pinned by loads; stores take no time
        a[slot("vllm:kv_offload_cpu_cache_read_usage_perc")] = read
        a[slot("vllm:kv_offload_cpu_cache_write_usage_perc")] = 0.0
        a[slot("vllm:kv_offload_cpu_cache_usage_perc")] = read

    def _nixl(self, connector: NixlConnector | None) -> None:
        """vLLM's NixlPromMetrics.observe: each worker's transfer (its duration on the link,
        its bytes and descriptors; the post is not modelled: 0 s), and the counters —
        failed transfers (a handshake or read that failed), expired holds and reads of
        released blocks on the prefill side."""
        if connector is None:
            return
        xfer, post, nbytes, descs = self._nixl_hist
        records, connector.xfers = connector.xfers, []
        if records:
            seconds, sizes, counts = zip(*records, strict=True)
            xfer.observe_many(seconds)
            post.observe_many([0.0] * len(records))
            nbytes.observe_many(sizes)
            descs.observe_many(counts)
        now = (connector.failures, connector.expired, connector.after_expiry)
        for name, n, before in zip(("vllm:nixl_num_failed_transfers",
                                    "vllm:nixl_num_kv_expired_reqs",
                                    "vllm:nixl_num_notifications_after_expiry"),
                                   now, self._nixl_seen, strict=True):
            self.a[self.slot(name)] += n - before
        self._nixl_seen = now
