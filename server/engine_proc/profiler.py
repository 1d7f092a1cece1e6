"""vLLM's `/start_profile` and `/stop_profile` on an emulated engine core: each step, as vLLM's
torch profiler would show it, written as a Chrome trace that Perfetto and TensorBoard open.

Why it exists: `vllm bench serve --profile` and operators profiling a pod call these routes,
and a capacity planner wants to see where an emulated chip's time goes. vLLM 0.33.0's worker
profiler (`vllm/profiler/wrapper.py` `WorkerProfiler`, `vllm/v1/worker/gpu_worker.py`
`profile` and `annotate_profile`), followed:

- a session starts at `/start_profile` (a second start while one is active is vLLM's 409) and
  ends at `/stop_profile`, when the trace is written; `delay_iterations` d > 0 records from
  the d-th step on, `max_iterations` m > 0 ends the session (and writes) after m steps;
- one file per engine core in `torch_profiler_dir`: `[{prefix}_]dp{R}_pp0_tp0_dcp0_ep0_rank
  {G}.{ms}.pt.trace.json[.gz]`, torch's `tensorboard_trace_handler` name for the worker that
  leads data-parallel rank R (G = R × tp × pp, its global rank); in a fleet (not a pod) the
  deployment's name goes before `dp`, since every deployment has a rank 0;
- each step is one event named as vLLM annotates it, `execute_context_{n}({tokens})_generation_
  {n}({tokens})` (context: requests still prefilling), from the emulated start of its compute
  for its emulated duration; a compile stall is an event of its own on a second track; the
  arguments carry the cost model's breakdown (memory, compute, overhead and link seconds, the
  bound, FLOPs and bytes per memory tier), and counters the batch and the KV usage each step
  leaves.

Times are the emulated timeline's microseconds, so a trace of a run at `time_scale` 0.01 shows
the chip's real step times. The events are kept in memory until written: a session records at
most `MAX_STEPS` steps (then it stops recording, with a warning).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import time
from typing import Any

from server.engine.core import EngineCore, StepResult
from server.engine.profiler_config import ProfilerConfig
from server.ipc.deployment import DeploymentInfo

log = logging.getLogger("doppelchip.engine")
MAX_STEPS = 500_000


class ProfilerAlreadyActive(Exception):
    """vLLM's ProfilerAlreadyActiveError (HTTP 409)."""


class StepProfiler:
    def __init__(self, config: ProfilerConfig, info: DeploymentInfo, pod: bool = True) -> None:
        self.config, self.info = config, info
        self.pod = pod  # a fleet's deployments share the directory: their names say which
        self.active = False  # between start and stop (vLLM's `_active`)
        self.running = False  # recording (after the delay)
        self.count = self.recorded = self.steps = 0  # steps seen, profiled, written as events
        self.delay = self.limit = 0
        self.prefix: str | None = None
        self.events: list[dict[str, Any]] = []
        self.written: list[str] = []  # the files written, for the log and tests

    @property
    def worker_name(self) -> str:
        info = self.info
        rank = info.dp_rank * max(1, info.tensor_parallel) * max(1, info.pipeline_parallel)
        name = f"dp{info.dp_rank}_pp0_tp0_dcp0_ep0_rank{rank}"
        if not self.pod:  # every deployment of a fleet has a rank 0: its name goes first
            name = f"{info.name}_{name}"
        return f"{self.prefix}_{name}" if self.prefix else name

    def start(self, prefix: str | None, delay: int | None, limit: int | None) -> None:
        if self.active:
            raise ProfilerAlreadyActive("A profiling session is already active. Call "
                                        "/stop_profile before starting another session.")
        self.prefix = prefix
        self.delay = self.config.delay_iterations if delay is None else delay
        self.limit = self.config.max_iterations if limit is None else limit
        self.active, self.running = True, self.delay == 0
        self.count = self.recorded = self.steps = 0
        self.events = []

    def step(self, start: float, result: StepResult, core: EngineCore) -> None:
        """After each engine step (vLLM's `WorkerProfiler.step`, then the step's annotation)."""
        if not self.active:
            return
        self.count += 1
        if not self.running and self.delay > 0 and self.count == self.delay:
            self.running = True
        if not self.running:
            return
        self.recorded += 1
        if self.limit > 0 and self.recorded > self.limit:
            self.stop()
            return
        if self.recorded > MAX_STEPS:
            if self.recorded == MAX_STEPS + 1:
                log.warning("profiler: %d steps recorded, no more until /stop_profile",
                            MAX_STEPS)
            return
        self._record(start, result, core)

    def _record(self, start: float, result: StepResult, core: EngineCore) -> None:
        self.steps += 1
        ctx_n = ctx_tokens = gen_n = gen_tokens = 0
        for entry in result.output.scheduled:
            if entry.is_prefill:
                ctx_n, ctx_tokens = ctx_n + 1, ctx_tokens + entry.num_new_tokens
            else:
                gen_n += 1
                gen_tokens += entry.num_new_tokens + entry.num_draft_tokens
        cost, n, us = result.cost, result.micro_batches, 1e6
        compute_at = start + result.stall_s
        if result.stall_s > 0:
            self.events.append({"ph": "X", "cat": "compile", "name": result.stall_reason or
                                "compile", "pid": 0, "tid": 1, "ts": start * us,
                                "dur": result.stall_s * us})
        self.events.append({
            "ph": "X", "cat": "gpu_user_annotation", "pid": 0, "tid": 0,
            "name": f"execute_context_{ctx_n}({ctx_tokens})_generation_{gen_n}({gen_tokens})",
            "ts": compute_at * us, "dur": (result.seconds - result.stall_s) * us,
            "args": {"num_tokens": ctx_tokens + gen_tokens, "bound": cost.bound,
                     "micro_batches": n, "memory_s": cost.memory_s, "compute_s": cost.compute_s,
                     "overhead_s": cost.overhead_s, "link_s": cost.link_s,
                     "flops": cost.flops * n,
                     "bytes": {tier: b * n for tier, b in cost.bytes_by_tier}}})
        sched, end = core.scheduler, (start + result.seconds) * us  # the state the step left
        self.events.append({"ph": "C", "name": "batch", "pid": 0, "ts": end,
                            "args": {"running": sched.num_running,
                                     "waiting": sched.num_waiting}})
        self.events.append({"ph": "C", "name": "kv_cache_usage", "pid": 0, "ts": end,
                            "args": {"kv_cache_usage_perc": sched.kv.usage}})

    def stop(self) -> str | None:
        """End the session; write its trace if it recorded (the file's path)."""
        if not self.active:
            log.warning("Profiler was not started, nothing to stop.")
            return None
        was_running = self.running
        self.active = self.running = False
        if not was_running:
            return None
        path = self._write()
        self.events = []
        return path

    def _write(self) -> str | None:
        """The trace file (None when it could not be written: logged, the engine goes on)."""
        try:
            return self._write_file()
        except OSError as e:
            log.error("profiler trace of %s (rank %d) not written: %s", self.info.name,
                      self.info.rank, e)
            return None

    def _write_file(self) -> str:
        info, cfg = self.info, self.config
        os.makedirs(cfg.torch_profiler_dir, exist_ok=True)
        name = f"{self.worker_name}.{time.time_ns() // 1_000_000}.pt.trace.json"
        path = os.path.join(cfg.torch_profiler_dir, name + (".gz" if cfg.torch_profiler_use_gzip
                                                            else ""))
        meta = [{"ph": "M", "name": "process_name", "pid": 0,
                 "args": {"name": f"engine core {info.name} rank {info.rank} "
                                  f"({info.chip_count} x {info.chip}, emulated)"}},
                {"ph": "M", "name": "thread_name", "pid": 0, "tid": 0,
                 "args": {"name": "steps (emulated)"}},
                {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1,
                 "args": {"name": "compile stalls (emulated)"}}]
        doc = {"schemaVersion": 1, "traceName": path, "displayTimeUnit": "ms",
               "deviceProperties": [{"id": 0, "name": info.chip}],
               "doppelchip": {"deployment": info.name, "model": info.model,
                              "quant": info.quant, "engine": info.engine, "chip": info.chip,
                              "chips": info.chip_count, "tensor_parallel": info.tensor_parallel,
                              "pipeline_parallel": info.pipeline_parallel,
                              "timeline": "emulated microseconds"},
               "traceEvents": meta + self.events}
        data = json.dumps(doc).encode()
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:  # whole or not at all: a reader never sees half a trace
            f.write(gzip.compress(data, 6) if cfg.torch_profiler_use_gzip else data)
        os.replace(tmp, path)
        self.written.append(path)
        log.info("profiler trace of %s (rank %d): %s, %d steps", info.name, info.rank, path,
                 self.steps)
        return path
