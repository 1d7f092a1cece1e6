"""`/metrics`: one consistent view over every engine and front-end process of a server.

At scrape time the collector copies each engine's stats array and each front end's request
metrics (seqlocked snapshots, no IPC, no waiting on a busy engine), sums the front ends' blocks
per (deployment, rank), and renders vLLM's series (labels `model_name`, `engine` = the
data-parallel rank, and in fleet mode `deployment`) and doppelchip's device series (in fleet
mode `deployment`; `doppelchip_chips` also names the `chip`, as an info metric would, rather
than every series repeating it). A pod's series carry no `deployment` label: it serves one,
and the scraper's target labels say which (deploy/k8s's ServiceMonitor sets it), as for a
vLLM pod.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from server.ipc.deployment import DeploymentInfo
from server.ipc.paths import RunDir
from server.stats.buckets import Overrides
from server.stats.collector_sglang import compile_sglang
from server.stats.collector_trtllm import IterationLog, compile_trtllm
from server.stats.exposition import Exposition, Scrape
from server.stats.layout import Layout, MetricDef
from server.stats.lora import LORA_INFO, LORA_INFO_HELP, lora_info_lines
from server.stats.schema import HIDDEN_0_10, engine_metrics, request_metrics
from server.stats.schema_features import OFFLOAD_CONFIG_INFO, OFFLOAD_CONFIG_INFO_HELP
from server.stats.shm import StatsFile


class StatsCollector:
    def __init__(self, infos: list[list[DeploymentInfo]], run_dir: RunDir, num_frontends: int,
                 time_scale: float, wall0: float, show_hidden_metrics: bool = False,
                 pod: bool = False, buckets: Overrides | None = None,
                 log_stats: bool = True, series: str = "vllm", pid: int = 0) -> None:
        """`log_stats` False (vLLM's --disable-log-stats): vLLM then builds no stat loggers,
        so none of the engine's and requests' vllm: series exist; doppelchip's own stay.
        `series` "sglang" (an SGLang pod with --enable-metrics): SGLang's sglang: series
        instead of vLLM's (`server.stats.collector_sglang`); "trtllm" (a TensorRT-LLM pod with
        --enable-metrics): TensorRT-LLM's trtllm_ series, their gauges labelled with `pid`
        (`server.stats.collector_trtllm`)."""
        self.infos, self.run, self.num_frontends = infos, run_dir, num_frontends
        self.pod, self.log_stats, self.series, self.pid = pod, log_stats, series, pid
        self.iteration_log: IterationLog | None = None  # a TensorRT-LLM pod's /metrics JSON
        self.show_hidden = show_hidden_metrics
        self.scale, self.wall0 = time_scale, wall0
        max_len = max((r.capacity.max_model_len for d in infos for r in d), default=1)
        faults = any(r.faults for d in infos for r in d)  # failure injection (issue 13)
        self.request_layout = Layout(request_metrics(max(1, max_len), faults, buckets, series))
        self.keys = [(d, r.rank) for d, ranks in enumerate(infos) for r in ranks]
        self.engine_layouts = {(d, r.rank): Layout(engine_metrics(r))
                               for d, ranks in enumerate(infos) for r in ranks}
        self._engine_files: dict[tuple[int, int], StatsFile] = {}
        self._frontend_files: dict[int, StatsFile] = {}
        self.plan = self._compile()

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

    def render(self) -> str:
        """The stats arrays' series in the Prometheus text format (see `exposition`)."""
        return self.plan.render(self.scrape())

    def iteration_stats(self) -> list[dict]:
        """A TensorRT-LLM pod's `/metrics` JSON (`collector_trtllm.IterationLog`); [] on
        other pods."""
        return self.iteration_log.drain(self.scrape()) if self.iteration_log else []

    def scrape(self) -> Scrape:
        """The arrays one scrape reads (engines' idle energy and cost brought up to now)."""
        now = (time.monotonic() - self.wall0) / self.scale
        engines: dict[tuple[int, int], np.ndarray | None] = {}
        summed: dict[int, np.ndarray] = {}  # deployment -> its ranks' arrays, summed
        for key in self.keys:
            info = self.infos[key[0]][key[1]]
            arr = self._engine(key)
            if arr is None or not info.placed:
                engines[key] = None
                continue
            summed[key[0]] = summed.get(key[0], 0) + arr
            layout = self.engine_layouts[key]
            if arr[layout.slot("_idle")] and now > arr[layout.slot("_t")]:  # idle since _t
                gap = now - arr[layout.slot("_t")]
                arr = arr.copy()
                arr[layout.slot("doppelchip_energy_joules")] += info.idle_watts * gap
                arr[layout.slot("doppelchip_cost_dollars")] += info.usd_per_s * gap
            engines[key] = arr
        return Scrape(self._requests(), engines, summed)

    def _vllm_labels(self, info: DeploymentInfo) -> list[tuple[str, str]]:
        labels = [("model_name", info.model_name), ("engine", str(info.dp_rank))]
        return labels + ([] if self.pod else [("deployment", info.name)])

    def _compile(self) -> Exposition:
        """The plan, in the order families were always rendered: per (deployment, rank) its
        request series, then its engine's; then the series vLLM sums over ranks."""
        plan = Exposition()
        req_offset = self.request_layout.offset
        for k, key in enumerate(self.keys):
            info = self.infos[key[0]][key[1]]
            vllm = self._vllm_labels(info)
            dev = [] if self.pod else [("deployment", info.name)]
            for d in self.request_layout.defs.values():
                if d.name.startswith(("sglang:", "trtllm_")):  # (compile_sglang, _trtllm)
                    continue
                plan.add_def(d, vllm if d.name.startswith("vllm:") else dev,
                             lambda s, k=k: s.requests[k], req_offset[d.name])
            if info.placed:
                self._compile_engine(plan, key, info, vllm, dev)
        for d_index, ranks in enumerate(self.infos):
            if not ranks or not any(r.placed for r in ranks):
                continue
            info, layout = ranks[0], self.engine_layouts[(d_index, ranks[0].rank)]
            labels = [("model_name", info.model_name)]
            labels += [] if self.pod else [("deployment", info.name)]
            for d in layout.defs.values():
                if not d.per_engine:
                    plan.add_def(d, labels, lambda s, d_index=d_index: s.summed.get(d_index),
                                 layout.offset[d.name])
            if info.max_loras:  # --- LoRA (issue 13) ---
                paths = [self.run.engine_stats(d_index, r.rank) for r in ranks]
                plan.add_dynamic(LORA_INFO, "gauge", LORA_INFO_HELP, lora_info_lines(
                    paths, info.max_loras, [] if self.pod else [("deployment", info.name)]))
        if not self.log_stats or self.series != "vllm":
            plan.families = {n: f for n, f in plan.families.items() if not n.startswith("vllm:")}
        if self.series == "sglang":
            compile_sglang(plan, self.infos, self.request_layout, self.engine_layouts, self.keys)
        elif self.series == "trtllm":
            self.iteration_log = compile_trtllm(plan, self.infos, self.request_layout,
                                             self.engine_layouts, self.keys, self.pid)
        return plan

    def _compile_engine(self, plan: Exposition, key: tuple[int, int], info: DeploymentInfo,
                        vllm: list[tuple[str, str]], dev: list[tuple[str, str]]) -> None:
        layout = self.engine_layouts[key]

        def engine(s: Scrape) -> np.ndarray | None:
            return s.engines[key]

        total, used = info.capacity.kv_blocks_total, layout.slot("_kv_used")

        def usage(s: Scrape) -> np.ndarray | None:
            arr = s.engines[key]
            return None if arr is None else np.array([arr[used] / total if total else 0.0])

        kv = "vllm:kv_cache_usage_perc"
        plan.add_value(kv, "gauge", "KV-cache usage. 1 means 100 percent usage.", vllm, usage)
        if self.show_hidden:  # vLLM 0.11.x's deprecated names (schema.HIDDEN_0_10)
            for name, (kind, doc, current) in HIDDEN_0_10.items():
                if current == kv:
                    plan.add_value(name, kind, doc, vllm, usage)
                else:
                    plan.add_def(MetricDef(name, kind, doc), vllm, engine, layout.slot(current))
        config = [("engine", str(info.dp_rank)), *([] if self.pod else [("deployment", info.name)]),
                  ("model_name", info.model_name),
                  ("block_size", str(info.capacity.block_size)), ("num_gpu_blocks", str(total)),
                  ("enable_prefix_caching", str(info.enable_prefix_caching)),
                  ("gpu_memory_utilization", str(info.gpu_memory_utilisation)),
                  ("cache_dtype", info.cache_dtype)]
        plan.add_value("vllm:cache_config_info", "gauge",
                       "Information of the LLMEngine CacheConfig", config, _when(engine, 1.0))
        if info.kv_offload_blocks:  # vLLM's CPUOffloadingInfo, one series (docs/KV_OFFLOAD.md)
            chunks, ctx = info.kv_offload_blocks, info.capacity.max_model_len
            per_request = -(-ctx // info.capacity.block_size)
            offload = [*vllm, ("cpu_num_chunks", str(chunks)), ("cpu_blocks_per_chunk", "1"),
                       ("cpu_kv_cache_size_bytes", str(info.kv_offload_bytes)),
                       ("cpu_kv_cache_size_tokens", str(chunks * ctx // per_request))]
            plan.add_value(OFFLOAD_CONFIG_INFO, "gauge", OFFLOAD_CONFIG_INFO_HELP, offload,
                           _when(engine, 1.0))
        for d in layout.defs.values():
            if d.name.startswith("_") or not d.per_engine:
                continue
            plan.add_def(d, vllm if d.name.startswith("vllm:") else dev, engine,
                         layout.offset[d.name])
        static = (
            ("doppelchip_chips", "Chips the deployment is placed on.", "chip",
             [(info.chip, info.chip_count)]),
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
            plan.family(name, "gauge", doc)
            for value_label, value in samples:
                labels = dev + ([(label, value_label)] if label else [])
                plan.add_value(name, "gauge", doc, labels, _when(engine, float(value)))


def _when(array: Callable[[Scrape], np.ndarray | None], value: float
          ) -> Callable[[Scrape], np.ndarray | None]:
    """A constant series, present while `array` is."""
    vector = np.array([value])
    return lambda s: None if array(s) is None else vector
