"""The exposition of a TensorRT-LLM pod (`--http-api trtllm --enable-metrics`), served on
`/prometheus/metrics`: TensorRT-LLM's `trtllm_` series instead of vLLM's, from the same stats
arrays (`server.stats.schema_trtllm`), and the iteration stats of its `/metrics` JSON.

As trtllm-serve exports them (`prometheus_client` in multiprocess mode, TensorRT-LLM 1.3):

- labels `engine_type` (the backend: `pytorch`, trtllm-serve's default) and `model_name` (the
  served name); gauges add `pid` (the multiprocess collector's `all` mode): the pod's main
  process (the supervisor), the same whichever front end answers the scrape;
- a series appears once it has a value (the multiprocess mode writes a labelled series only
  once it is used): a request counter once it counted something, a histogram once it observed
  something; the iteration gauges and the config info from start-up (the executor's first
  stats, `log_config_info`);
- **the iteration series are refreshed only when a request has finished**: trtllm-serve's
  collector loop sleeps until a request completes (`_iteration_stats_wakeup_event`), then
  drains the iteration stats. Here they are recomputed at a scrape when some request finished
  since the previous one, and held otherwise, so a pod whose requests are all still running
  shows the queue it had when the last one ended, as a real one does to a router;
- they are rank 0's (TensorRT-LLM reports the first rank's iteration stats);
- `kvCacheStats` in blocks: reused = prefix-cache hit tokens / block size, missed = the other
  prompt tokens / block size (rounded), hit rate = reused / (reused + missed); iteration
  latency = the mean step of the engine since the previous refresh (emulated seconds);
  `gpuMemUsage` = the weights and the KV pool of one GPU; CPU and pinned memory 0 (the PyTorch
  backend does not measure them);
- a pod that speculates adds `specDecodingStats` and the `trtllm_spec_decode_*` series, read at
  the same refreshes (server.stats.collector_trtllm_spec).

doppelchip's own device series stay (`doppelchip_*`, no clash with any trtllm_ name).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from server.ipc.deployment import DeploymentInfo
from server.stats.collector_trtllm_spec import SpecWindow, add_series
from server.stats.collector_trtllm_spec import config_info as spec_config_info
from server.stats.exposition import Exposition, Scrape
from server.stats.layout import Layout
from server.stats.schema_trtllm import CONFIG_INFO, FINISHED_REASONS, ITERATION_SERIES

ENGINE_TYPE = "pytorch"  # trtllm-serve's default backend (the `engine_type` label)
# the iteration values, in the order `Iteration.compute` returns them
_VALUES = ("running", "waiting", "used", "free", "reused", "missed", "completed", "latency")
QUANT_ALGO = {"fp8": "FP8", "nvfp4": "NVFP4", "mxfp4": "W4A16_MXFP4", "int4": "W4A16_AWQ",
              "awq": "W4A16_AWQ", "gptq": "W4A16_GPTQ", "int8": "W8A16"}  # QuantAlgo's names


def labels(info: DeploymentInfo) -> list[tuple[str, str]]:
    return [("engine_type", ENGINE_TYPE), ("model_name", info.model_name)]


def gpu_memory_bytes(info: DeploymentInfo) -> float:
    """One GPU's weights and KV pool (what the PyTorch backend's `gpuMemUsage` reads)."""
    cap = info.capacity
    pool = info.kv_bytes_per_token * cap.block_size * cap.kv_blocks_total
    return (sum(info.weights_resident) + pool) / max(1, info.chip_count)


class Iteration:
    """Rank 0's iteration values: an idle engine's at start-up, then recomputed only when a
    request has finished since the last read (see the module's docstring). Read once per
    scrape, whatever the number of series that show them."""

    def __init__(self, key: tuple[int, int], info: DeploymentInfo, layout: Layout,
                 finished: Callable[[Scrape], float]) -> None:
        self.key, self.finished_of = key, finished
        self.scrape: Scrape | None = None  # the last scrape read
        self.bs = info.capacity.block_size
        self.total = info.capacity.kv_blocks_total
        slot = layout.slot
        self.running, self.waiting = slot("vllm:num_requests_running"), \
            slot("vllm:num_requests_waiting")
        self.used, self.steps = slot("_kv_used"), slot("_steps")
        self.queries, self.hits = slot("vllm:prefix_cache_queries"), slot("vllm:prefix_cache_hits")
        self.step_sum = layout.hist("doppelchip_step_seconds")[1]
        # the executor's stats at start-up, which trtllm-serve drains once it is up: idle
        self.finished = 0.0
        self.values = np.array([0.0, 0.0, 0.0, self.total, 0.0, 0.0, 0.0, 0.0])
        self.refreshes = 1
        self.last_steps, self.last_seconds, self.latency = 0.0, 0.0, 0.0
        self.spec = SpecWindow(info, layout) if info.num_speculative_tokens else None

    def read(self, s: Scrape) -> np.ndarray | None:
        """The values scrape `s` shows (None while the engine is not up)."""
        arr = s.engines[self.key]
        if arr is None:
            return None
        if s is not self.scrape:
            self.scrape = s
            finished = self.finished_of(s)
            if finished != self.finished:
                self.finished, self.values = finished, self.compute(arr, finished)
                self.refreshes += 1
        return self.values

    def compute(self, arr: np.ndarray, finished: float) -> np.ndarray:
        steps, seconds = arr[self.steps], arr[self.step_sum]
        if steps > self.last_steps:
            self.latency = (seconds - self.last_seconds) / (steps - self.last_steps)
            if self.spec is not None:
                self.spec.refresh(arr, steps - self.last_steps, seconds - self.last_seconds)
            self.last_steps, self.last_seconds = steps, seconds
        hits, queries = arr[self.hits], arr[self.queries]
        reused = float(np.floor(hits / self.bs + 0.5))
        missed = float(np.floor((queries - hits) / self.bs + 0.5))
        used = arr[self.used]
        return np.array([arr[self.running], arr[self.waiting], used, self.total - used, reused,
                         missed, finished, self.latency])

    def stat(self, values: np.ndarray, info: DeploymentInfo, completed: int) -> dict:
        """One entry of trtllm-serve's `/metrics` JSON (the executor's IterationStats)."""
        v = dict(zip(_VALUES, values.tolist(), strict=True))
        reused, missed = int(v["reused"]), int(v["missed"])
        cap = info.capacity
        spec = {"specDecodingStats": self.spec.stat()} if self.spec is not None else {}
        return {
            "cpuMemUsage": 0, "gpuMemUsage": int(gpu_memory_bytes(info)),
            "iter": int(self.last_steps), "iterLatencyMS": v["latency"] * 1000.0,
            "kvCacheStats": {
                "allocNewBlocks": missed, "allocTotalBlocks": reused + missed,
                "cacheHitRate": reused / (reused + missed) if reused + missed else 0.0,
                "freeNumBlocks": int(v["free"]), "maxNumBlocks": cap.kv_blocks_total,
                "missedBlocks": missed, "reusedBlocks": reused,
                "tokensPerBlock": cap.block_size, "usedNumBlocks": int(v["used"])},
            "maxBatchSizeRuntime": cap.max_num_seqs, "maxBatchSizeStatic": cap.max_num_seqs,
            "maxNumActiveRequests": cap.max_num_seqs,
            "maxNumTokensRuntime": info.max_num_batched_tokens,
            "numActiveRequests": int(v["running"]), "numCompletedRequests": completed,
            "numQueuedRequests": int(v["waiting"]), "pinnedMemUsage": 0, **spec,
            "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
        }


class IterationLog:
    """trtllm-serve's `/metrics` JSON: the iteration stats its collector loop drained since
    the previous call, which it then forgets. Here one entry, the latest iteration, when the
    values were refreshed (a request finished) since the previous call; [] otherwise."""

    def __init__(self, info: DeploymentInfo, iteration: Iteration) -> None:
        self.info, self.iteration = info, iteration
        self.seen = (0, 0.0)  # (refreshes, finished requests) at the previous call

    def drain(self, s: Scrape) -> list[dict]:
        values = self.iteration.read(s)
        if values is None:
            return []
        finished = float(values[_VALUES.index("completed")])
        seen, self.seen = self.seen, (self.iteration.refreshes, finished)
        if self.iteration.refreshes == seen[0]:
            return []
        return [self.iteration.stat(values, self.info, int(finished - seen[1]))]


def finished_total(request_layout: Layout, rows: list[int]) -> Callable[[Scrape], float]:
    """The deployment's requests that finished and were logged (stop or length)."""
    slots = [request_layout.slot("trtllm_request_success", r) for r in FINISHED_REASONS]
    return lambda s: float(s.requests[rows][:, slots].sum())


def config_info(info: DeploymentInfo) -> dict[str, list[tuple[str, str]]]:
    """`_log_config_info_metrics`' labels: model, parallelism, speculation (a pod that
    speculates), KV cache."""
    tp, pp = info.tensor_parallel, info.pipeline_parallel
    spec = {"trtllm_speculative_config_info": spec_config_info(info)
            } if info.num_speculative_tokens else {}
    return {
        "trtllm_model_config_info": [
            ("model", info.model_path or info.model), ("served_model_name", info.model_name),
            ("dtype", "auto"), ("quantization", QUANT_ALGO.get(info.quant, "none")),
            ("max_model_len", str(info.capacity.max_model_len)), ("gpu_type", info.chip)],
        "trtllm_parallel_config_info": [
            ("tensor_parallel_size", str(tp)), ("pipeline_parallel_size", str(pp)),
            ("context_parallel_size", "1"), ("gpu_count", str(tp * pp))],
        **spec,
        "trtllm_kv_cache_config_info": [
            ("enable_block_reuse", str(info.enable_prefix_caching)),
            ("enable_partial_reuse", "True"),
            ("free_gpu_memory_fraction", str(info.gpu_memory_utilisation)),
            ("cache_dtype", info.cache_dtype)],
    }


def compile_trtllm(plan: Exposition, infos: list[list[DeploymentInfo]],
                   request_layout: Layout, engine_layouts: dict[tuple[int, int], Layout],
                   keys: list[tuple[int, int]], pid: int) -> IterationLog | None:
    """Add every trtllm_ series of the pod's deployment to `plan`, gauges labelled with `pid`;
    returns its `/metrics` JSON, which reads the same held values."""
    pid_label = [("pid", str(pid))]
    offset = request_layout.offset
    log: IterationLog | None = None
    for d_index, ranks in enumerate(infos):
        rows = [k for k, key in enumerate(keys) if key[0] == d_index]
        placed = [r for r in ranks if r.placed]
        if not placed:
            continue
        info = placed[0]
        finished = finished_total(request_layout, rows)

        def summed(s: Scrape, rows: list[int] = rows) -> np.ndarray:
            return s.requests[rows].sum(axis=0)

        for d in request_layout.defs.values():
            if d.name.startswith("trtllm_"):
                plan.add_def(d, labels(info), summed, offset[d.name], sparse=True)
        key = (d_index, info.rank)
        iteration = Iteration(key, info, engine_layouts[key], finished)
        log = log or IterationLog(info, iteration)
        _iteration(plan, key, info, iteration, pid_label)
    return log


def _iteration(plan: Exposition, key: tuple[int, int], info: DeploymentInfo,
               iteration: Iteration, pid: list[tuple[str, str]]) -> None:
    cap = info.capacity

    def held(index: int, counter: bool = False) -> Callable[[Scrape], np.ndarray | None]:
        def source(s: Scrape) -> np.ndarray | None:
            v = iteration.read(s)
            if v is None or (counter and not v[index]):
                return None
            return v[index:index + 1]
        return source

    def constant(value: float) -> Callable[[Scrape], np.ndarray | None]:
        vector = np.array([float(value)])
        return lambda s: None if s.engines[key] is None else vector

    def ratio(num: int, den: int | None, total: float = 0.0
              ) -> Callable[[Scrape], np.ndarray | None]:
        def source(s: Scrape) -> np.ndarray | None:
            v = iteration.read(s)
            if v is None:
                return None
            d = v[den] + v[num] if den is not None else total
            return np.array([v[num] / d if d else 0.0])
        return source

    i = {name: n for n, name in enumerate(_VALUES)}
    values = {
        "trtllm_kv_cache_hit_rate": ratio(i["reused"], i["missed"]),
        "trtllm_kv_cache_reused_blocks": held(i["reused"], counter=True),
        "trtllm_kv_cache_missed_blocks": held(i["missed"], counter=True),
        "trtllm_kv_cache_utilization": ratio(i["used"], None, cap.kv_blocks_total),
        "trtllm_num_requests_running": held(i["running"]),
        "trtllm_num_requests_waiting": held(i["waiting"]),
        "trtllm_num_requests_completed": held(i["completed"], counter=True),
        "trtllm_max_num_active_requests": constant(cap.max_num_seqs),
        "trtllm_iteration_latency_seconds": held(i["latency"]),
        "trtllm_gpu_memory_usage_bytes": constant(gpu_memory_bytes(info)),
        "trtllm_cpu_memory_usage_bytes": constant(0),
        "trtllm_pinned_memory_usage_bytes": constant(0),
        "trtllm_max_batch_size_static": constant(cap.max_num_seqs),
        "trtllm_max_batch_size_runtime": constant(cap.max_num_seqs),
        "trtllm_max_num_tokens_runtime": constant(info.max_num_batched_tokens),
        "trtllm_kv_cache_max_blocks": constant(cap.kv_blocks_total),
        "trtllm_kv_cache_free_blocks": held(i["free"]),
        "trtllm_kv_cache_used_blocks": held(i["used"]),
        "trtllm_kv_cache_tokens_per_block": constant(cap.block_size),
    }
    base = labels(info)
    for name, (kind, doc) in ITERATION_SERIES.items():
        plan.add_value(name, kind, doc, base if kind == "counter" else base + pid, values[name])
    if iteration.spec is not None:
        add_series(plan, key, iteration.spec, iteration.read, base, pid)
    for name, settings in config_info(info).items():
        plan.add_value(name, "gauge", CONFIG_INFO[name], base + settings + pid, constant(1))
