"""`/metrics`: one consistent view over every engine and front-end process of a server.

At scrape time the collector copies each engine's stats array and each front end's request
metrics (seqlocked snapshots, no IPC, no waiting on a busy engine), sums the front ends' blocks
per (deployment, rank), and renders vLLM's series (labels `model_name`, `engine` = the rank,
`deployment`) and doppelchip's device series (labels `deployment`, `chip`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from server.ipc.messages import DeploymentInfo
from server.ipc.paths import RunDir
from server.stats.layout import Layout, MetricDef
from server.stats.schema import HIDDEN_0_10, engine_metrics, request_metrics
from server.stats.shm import StatsFile

VLLM = ["model_name", "engine", "deployment"]
DEV = ["deployment", "chip"]


class _Families:
    """The families of one scrape, created on first use, in a stable order."""

    def __init__(self) -> None:
        self.by_name: dict[str, Metric] = {}

    def get(self, d: MetricDef, labels: list[str]) -> Metric:
        fam = self.by_name.get(d.name)
        if fam is None:
            names = labels + ([d.label] if d.label else [])
            cls = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily,
                   "histogram": HistogramMetricFamily}[d.kind]
            fam = self.by_name[d.name] = cls(d.name, d.help, labels=names)
        return fam

    def add(self, d: MetricDef, labels: list[str], values: list[str], arr: np.ndarray,
            at: int) -> None:
        fam = self.get(d, labels)
        for i, extra in enumerate(d.values or (None,)):
            lv = values + ([extra] if extra is not None else [])
            if d.kind == "histogram":
                n = len(d.buckets) + 2
                counts = np.cumsum(arr[at + i * n : at + i * n + n - 1])
                buckets = [(floatToGoString(b), float(c))
                           for b, c in zip(d.buckets, counts, strict=False)]
                buckets.append(("+Inf", float(counts[-1])))
                fam.add_metric(lv, buckets, float(arr[at + i * n + n - 1]))  # type: ignore
            else:
                fam.add_metric(lv, float(arr[at + i]))


class StatsCollector(Collector):
    def __init__(self, infos: list[list[DeploymentInfo]], run_dir: RunDir, num_frontends: int,
                 time_scale: float, wall0: float, show_hidden_metrics: bool = False) -> None:
        self.infos, self.run, self.num_frontends = infos, run_dir, num_frontends
        self.show_hidden = show_hidden_metrics
        self.scale, self.wall0 = time_scale, wall0
        max_len = max((r.capacity.max_model_len for d in infos for r in d), default=1)
        self.request_layout = Layout(request_metrics(max(1, max_len)))
        self.keys = [(d, r.rank) for d, ranks in enumerate(infos) for r in ranks]
        self.engine_layouts = {(d, r.rank): Layout(engine_metrics(r))
                               for d, ranks in enumerate(infos) for r in ranks}
        self._engine_files: dict[tuple[int, int], StatsFile] = {}
        self._frontend_files: dict[int, StatsFile] = {}

    def _engine(self, key: tuple[int, int]) -> np.ndarray | None:
        f = self._engine_files.get(key)
        if f is None:
            path = self.run.engine_stats(*key)
            if not path.exists():
                return None
            f = self._engine_files[key] = StatsFile(path, self.engine_layouts[key].size)
        return f.snapshot()[0]

    def _requests(self) -> np.ndarray:
        """The front ends' request metrics, summed: one row per (deployment, rank)."""
        size = self.request_layout.size
        total = np.zeros((len(self.keys), size))
        for i in range(self.num_frontends):
            f = self._frontend_files.get(i)
            if f is None:
                path = self.run.frontend_stats(i)
                if not path.exists():
                    continue
                f = self._frontend_files[i] = StatsFile(path, size * len(self.keys))
            total += f.snapshot()[0].reshape(len(self.keys), size)
        return total

    def collect(self) -> Iterator[Metric]:
        fams = _Families()
        requests = self._requests()
        now = (time.monotonic() - self.wall0) / self.scale
        unlabelled: dict[int, np.ndarray] = {}  # deployment -> its ranks' arrays, summed
        for k, key in enumerate(self.keys):
            info = self.infos[key[0]][key[1]]
            vllm = [info.model_name, str(info.rank), info.name]
            dev = [info.name, info.chip]
            for d in self.request_layout.defs.values():
                is_vllm = d.name.startswith("vllm:")
                fams.add(d, VLLM if is_vllm else DEV, vllm if is_vllm else dev, requests[k],
                         self.request_layout.offset[d.name])
            arr = self._engine(key)
            if arr is None or not info.placed:
                continue
            self._engine_series(fams, info, self.engine_layouts[key], arr, now)
            unlabelled[key[0]] = unlabelled.get(key[0], 0) + arr
        for d_index, arr in unlabelled.items():
            info, layout = self.infos[d_index][0], self.engine_layouts[(d_index, 0)]
            for d in layout.defs.values():
                if not d.per_engine:
                    fams.add(d, ["model_name", "deployment"], [info.model_name, info.name], arr,
                             layout.offset[d.name])
        return iter(fams.by_name.values())

    def _engine_series(self, fams: _Families, info: DeploymentInfo, layout: Layout,
                       arr: np.ndarray, now: float) -> None:
        vllm = [info.model_name, str(info.rank), info.name]
        dev = [info.name, info.chip]
        arr = arr.copy()
        if arr[layout.slot("_idle")] and now > arr[layout.slot("_t")]:  # idle since _t
            gap = now - arr[layout.slot("_t")]
            arr[layout.slot("doppelchip_energy_joules")] += info.idle_watts * gap
            arr[layout.slot("doppelchip_cost_dollars")] += info.usd_per_s * gap
        total = info.capacity.kv_blocks_total
        kv = MetricDef("vllm:kv_cache_usage_perc", "gauge",
                       "KV-cache usage. 1 means 100 percent usage.")
        usage = arr[layout.slot("_kv_used")] / total if total else 0.0
        fams.get(kv, VLLM).add_metric(vllm, usage)
        if self.show_hidden:  # vLLM 0.11.x's deprecated names (schema.HIDDEN_0_10)
            for name, (kind, doc, current) in HIDDEN_0_10.items():
                value = usage if current == kv.name else arr[layout.slot(current)]
                fams.get(MetricDef(name, kind, doc), VLLM).add_metric(vllm, float(value))
        cfg = fams.by_name.setdefault("vllm:cache_config_info", GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
            labels=["engine", "deployment", "model_name", "block_size", "num_gpu_blocks",
                    "enable_prefix_caching", "gpu_memory_utilization", "cache_dtype"]))
        cfg.add_metric([str(info.rank), info.name, info.model_name, str(info.capacity.block_size),
                        str(total), str(info.enable_prefix_caching),
                        str(info.gpu_memory_utilisation), "auto"], 1.0)
        for d in layout.defs.values():
            if d.name.startswith("_") or not d.per_engine:
                continue
            fams.add(d, VLLM if d.name.startswith("vllm:") else DEV,
                     vllm if d.name.startswith("vllm:") else dev, arr, layout.offset[d.name])
        static = (
            ("doppelchip_chips", "Chips the deployment is placed on.", None,
             [(None, info.chip_count)]),
            ("doppelchip_weights_resident_bytes", "Weight bytes resident per memory tier.",
             "tier", [(t, b) for t, b in zip(info.tiers, info.weights_resident, strict=True)
                      if b > 0]),
            ("doppelchip_tier_peak_bandwidth_bytes_per_second",
             "Peak bandwidth of a memory tier, all chips of the deployment.", "tier",
             [(t, b) for t, b in zip(info.tiers, info.tier_peaks, strict=True) if b > 0]),
            ("doppelchip_peak_flops_per_second",
             "Dense peak FLOP/s of the deployment's chips on its compute path.", None,
             [(None, info.peak_flops)]),
        )
        for name, doc, label, samples in static:
            fam = fams.by_name.setdefault(name, GaugeMetricFamily(
                name, doc, labels=DEV + ([label] if label else [])))
            for value_label, value in samples:
                fam.add_metric(dev + ([value_label] if value_label else []), float(value))
