"""Where `doppelchip plan` runs its candidates: a local process pool (the default) or a Ray
cluster (`--ray ADDRESS`). Both take the same tasks and return the same results in the same
order, each tagged with the process that ran it (`pid`; under Ray also `ray_worker_id` and
`ray_node_id`), so that a test can tell where a candidate ran.

A task is a candidate's fleet file text and the `doppelchip simulate` argument list that
runs it, whose `--config` is `FLEET_PATH` until the worker writes the text to a file of its
own; `simulate` is the front door's function from such an argument list to the summary — the
very path of the printed command, so the printed command reproduces the result.

Ray is optional (`pip install 'doppelchip[ray]'`): asked for and missing, it is an error,
never a silent fallback to the pool.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

FLEET_PATH = "{FLEET}"  # the placeholder a task's argv names its fleet file by

Simulate = Callable[[list[str]], dict[str, Any]]


@dataclass(frozen=True)
class Task:
    fleet: str
    argv: tuple[str, ...]


class ExecError(RuntimeError):
    """The executor cannot run (Ray missing or unreachable); the message says why."""


def run_task(simulate: Simulate, task: Task) -> dict[str, Any]:
    """Run one task here: {"summary": ..., "pid": ...} (or {"error": ..., "pid": ...})."""
    with tempfile.TemporaryDirectory(prefix="doppelchip-plan-") as d:
        path = Path(d) / "fleet.toml"
        path.write_text(task.fleet)
        argv = [str(path) if a == FLEET_PATH else a for a in task.argv]
        try:
            out: dict[str, Any] = {"summary": simulate(argv)}
        except Exception as e:  # a candidate that cannot run is a result, not a crash
            out = {"error": f"{type(e).__name__}: {e}"}
    out["pid"] = os.getpid()
    return out


class PoolExecutor:
    """`jobs` worker processes (one process: run in this one, no pool)."""

    name = "process pool"

    def __init__(self, jobs: int) -> None:
        self.jobs = max(1, jobs)
        # forkserver, not fork: a forked child of a process with threads (grpc, NumPy's BLAS
        # pool, a test suite's servers) can inherit a held lock and spin forever
        self.pool = (ProcessPoolExecutor(self.jobs, mp_context=get_context("forkserver"))
                     if self.jobs > 1 else None)

    def map(self, simulate: Simulate, tasks: Sequence[Task]) -> list[dict[str, Any]]:
        if self.pool is None:
            return [run_task(simulate, t) for t in tasks]
        return list(self.pool.map(run_task, [simulate] * len(tasks), tasks))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def _ray():
    try:
        import ray
    except ImportError:
        raise ExecError("--ray needs Ray, which is not installed: pip install "
                        "'doppelchip[ray]'") from None
    return ray


def _ray_task(simulate: Simulate, task: Task) -> dict[str, Any]:
    """run_task in a Ray worker, tagged with the worker's and node's ids."""
    import ray

    out = run_task(simulate, task)
    ctx = ray.get_runtime_context()
    out["ray_worker_id"] = ctx.get_worker_id()
    out["ray_node_id"] = ctx.get_node_id()
    return out


class RayExecutor:
    """Tasks on a Ray cluster, one CPU each. `address` is what `ray.init(address=...)` takes
    ("auto", "ray://host:10001", host:port of a head started with `ray start --head`), or
    "local" for a new local instance of `jobs` CPUs on 127.0.0.1, stopped on close. When this
    process is already connected (`ray.init` called by the caller, as a test does), that
    connection is used and left open."""

    name = "ray"

    def __init__(self, address: str, jobs: int) -> None:
        ray = _ray()
        self.ray = ray
        self.address = address
        self.jobs = max(1, jobs)
        self.owned = not ray.is_initialized()
        try:
            if not self.owned:
                pass
            elif address == "local":
                ray.init(num_cpus=self.jobs, include_dashboard=False, log_to_driver=False,
                         configure_logging=False, _node_ip_address="127.0.0.1")
            else:
                check_reachable(address)
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except Exception as e:  # ConnectionError, RuntimeError, ValueError: say which
            raise ExecError(f"cannot start or reach Ray at {address!r}: {e}") from e
        self.driver_worker_id = ray.get_runtime_context().get_worker_id()  # this process's
        if address != "local":  # a batch as wide as the cluster's CPUs
            self.jobs = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.remote = ray.remote(num_cpus=1)(_ray_task)

    def map(self, simulate: Simulate, tasks: Sequence[Task]) -> list[dict[str, Any]]:
        fn = self.ray.put(simulate)
        return self.ray.get([self.remote.remote(fn, t) for t in tasks])

    def close(self) -> None:
        if self.owned:
            self.ray.shutdown()


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse a head that does not answer in `timeout_s`: `ray.init` to a dead GCS retries
    for minutes (measured: over 200 s for 127.0.0.1:1, Ray 2.x) before it gives up. Only an
    explicit `host:port` or `ray://host:port` is checked; "auto" is Ray's to resolve."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConnectionError(f"nothing answers at {host}:{port} ({e})") from e


def make_executor(ray_address: str | None, jobs: int) -> PoolExecutor | RayExecutor:
    return RayExecutor(ray_address, jobs) if ray_address else PoolExecutor(jobs)
