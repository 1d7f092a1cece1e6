"""The engine-core process's entry point: build the core, say hello, run the loop.

A deployment that cannot be placed says so in its hello (and its stats file: state FAILED
with the reason) and exits 0; the supervisor does not restart it. Any other exit is a crash
(its traceback logged through this process's tagged logger, exit status 1): the supervisor
marks the deployment FAILED, ends its requests and restarts it.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import signal
import sys
from dataclasses import dataclass

import msgspec
import zmq

from devices import DeviceError
from server.engine.build import build_core
from server.engine.clock import Timeline
from server.engine.faults import has_device_faults
from server.engine.kv_events_config import KVEventsConfig
from server.engine.kv_transfer import KvTransferConfig
from server.engine.options import EngineOptions
from server.engine.profiler_config import ProfilerConfig
from server.engine.tokenizer import get_tokenizer
from server.engine_proc.faults import FaultDriver, schedule_of
from server.engine_proc.info import failed_info, placed_info
from server.engine_proc.loop import EngineLoop
from server.engine_proc.profiler import StepProfiler
from server.engine_proc.sentinel import Sentinel
from server.engine_proc.stats import EngineStats
from server.ipc import lifeline
from server.ipc import messages as m
from server.ipc.deployment import DeploymentInfo
from server.ipc.paths import RunDir
from server.logsetup import configure_logging

log = logging.getLogger("doppelchip.engine")


@dataclass(frozen=True)
class EngineSpec:
    """Everything an engine process needs, passed by the supervisor at spawn."""

    deployment: int  # index in the fleet
    rank: int  # data-parallel rank
    epoch: int  # incarnation: 0 at start, +1 per restart
    options: EngineOptions
    run_dir: str
    num_frontends: int
    time_scale: float
    wall0: float  # time.monotonic() at the shared timeline's origin
    cold: bool  # pay the cold start (a restart rebuilds what the crash lost)
    log_level: str
    check_integrity: bool = False  # run the scheduler's check_integrity() whenever it idles
    # the server's --custom-histogram-buckets, (family, bounds) pairs (server/stats/buckets.py)
    histogram_buckets: tuple[tuple[str, tuple[float, ...]], ...] = ()
    profiler_config: str = ""  # the server's --profiler-config (vLLM's JSON; "": off)
    pod: bool = False  # the server serves this deployment alone (vLLM's names for its files)
    exposed: bool = False  # the server binds off loopback: KV events may too (kv_events_config)
    supervisor_pid: int = 0  # exit when it is gone (server.ipc.lifeline); 0: no lifeline
    # a restart's KV-event endpoints: where the previous incarnation bound (its port 0
    # resolved), so that front ends and subscribers, which keep the address, find it again
    kv_events_pinned: tuple[str, str] = ("", "")


def _less_timer_slack() -> None:
    """Sub-millisecond deadlines (SRAM chips) need the kernel's timer slack below its 50 µs
    default; best effort (Linux prctl PR_SET_TIMERSLACK)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(29, 1, 0, 0, 0)


def engine_main(spec: EngineSpec) -> None:
    opts = spec.options
    configure_logging(spec.log_level, f"engine[{opts.name}/{spec.rank}]")
    if spec.supervisor_pid:
        lifeline.exit_with(spec.supervisor_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the supervisor, which drains
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _less_timer_slack()
    run = RunDir(spec.run_dir)
    tokenizer = get_tokenizer()
    try:
        core = build_core(opts, tokenizer)
    except (DeviceError, ValueError) as e:
        info = msgspec.structs.replace(failed_info(opts, spec.rank, str(e), tokenizer.vocab_size),
                                       histogram_buckets=spec.histogram_buckets)
        stats = EngineStats(run.engine_stats(spec.deployment, spec.rank), info, spec.epoch,
                            os.getpid())
        stats.set_state("failed", f"could not be placed: {e}")
        _hello(run, spec, info)
        log.warning("deployment %s could not be placed: %s", opts.name, e)
        return
    info = msgspec.structs.replace(placed_info(opts, spec.rank, core, tokenizer),
                                   histogram_buckets=spec.histogram_buckets)
    stats = EngineStats(run.engine_stats(spec.deployment, spec.rank), info, spec.epoch,
                        os.getpid())
    stats.set_state("compiling", "starting")
    profiler = ProfilerConfig.parse(spec.profiler_config)  # checked by `serve` already
    timeout = opts.recovery_timeout_s()  # vLLM's fault tolerance (None: off)
    sentinel = (Sentinel(info.dp_rank, opts.data_parallel_size, timeout)
                if timeout is not None else None)
    loop = EngineLoop(deployment=spec.deployment, rank=spec.rank, epoch=spec.epoch, core=core,
                      limits=info.limits, stats=stats, run_dir=run,
                      num_frontends=spec.num_frontends,
                      timeline=Timeline(spec.wall0, spec.time_scale), cold=spec.cold,
                      check_integrity=spec.check_integrity,
                      kv_events=KVEventsConfig.parse(opts.kv_events_config),
                      kv_offset=opts.kv_events_port_offset, kv_exposed=spec.exposed,
                      kv_pinned=spec.kv_events_pinned, kv_wire=opts.kv_events_wire,
                      kv_transfer=KvTransferConfig.parse(opts.kv_transfer_config), info=info,
                      faults=FaultDriver(schedule_of(opts), core, stats, spec.time_scale,
                                         opts.name, sentinel)
                      if has_device_faults(opts) else None, sentinel=sentinel,
                      profiler=StepProfiler(profiler, info, spec.pod)
                      if profiler.enabled else None,
                      prepare_on_startup=opts.checkpoint_prepare_on_startup)
    if loop.kv_pub is not None:  # KV events (issue 13): where subscribers go
        info = msgspec.structs.replace(
            info, kv_events_endpoint=loop.kv_pub.endpoint,
            kv_events_replay_endpoint=loop.kv_pub.replay_endpoint,
            kv_events_topic=loop.kv_pub.topic.decode(), kv_events_wire=opts.kv_events_wire)
    _hello(run, spec, info)
    gc.collect()  # the core, its tables and the tokenizer leave the collector's generations
    gc.freeze()
    log.info("engine core of %s (rank %d) up: pid %d", opts.name, spec.rank, os.getpid())
    try:
        loop.run()
    except Exception:  # logged tagged, once (multiprocessing would print it untagged)
        log.exception("engine core of %s (rank %d) crashed", opts.name, spec.rank)
        sys.exit(1)


def _hello(run: RunDir, spec: EngineSpec, info: DeploymentInfo) -> None:
    ctx = zmq.Context()  # its own: term() below waits until the hello is out of the process
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(run.supervisor_input())
    sock.send(m.encode(m.EngineHello(spec.deployment, spec.rank, spec.epoch, os.getpid(),
                                     info)))
    sock.close()
    ctx.term()
