"""`doppelchip plan --ray`: on a local Ray instance started here (2 CPUs on 127.0.0.1, its own
temporary directory, shut down after) the plan is the process pool's, and every candidate ran
in a Ray worker process, not in this one. Without Ray, `--ray` is an error, never a silent
fallback to the pool."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import pytest
from plan_grid import GRID, SLO, WORKLOAD, plan_json

from doppelchip.cli import main

SAME = ("deployment", "replicas", "chips", "usd_per_hour", "usd_per_mtok", "latency",
        "goodput_fraction", "fleet", "simulate_command")


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray", reason="doppelchip[ray] is not installed (make install-dev)")
    # a short path: Ray's unix sockets live under it (107-byte limit)
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    for attempt in range(3):  # Ray gives its raylet 30 s to register: a loaded machine may not
        try:
            ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
                     _temp_dir=temp, log_to_driver=False, configure_logging=False)
            break
        except Exception as e:
            ray.shutdown()  # what the failed start left running
            if attempt == 2 or "timed out during startup" not in str(e):
                raise
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def shown(plan: dict) -> list[dict]:
    return [plan, *plan["runners_up"], *plan["frontier"]]


def test_ray_gives_the_pools_answer_from_ray_workers(local_ray):
    pool = plan_json("--jobs", "2")
    on_ray = plan_json("--ray", "auto")
    assert on_ray["executor"]["name"] == "ray" and pool["executor"]["name"] == "process pool"
    assert {k: on_ray[k] for k in SAME} == {k: pool[k] for k in SAME}
    for key in ("runners_up", "frontier"):
        assert [{k: r[k] for k in SAME} for r in on_ray[key]] == \
            [{k: r[k] for k in SAME} for r in pool[key]]
    workers = set()
    for r in shown(on_ray):  # each ran in a Ray worker: a worker id, another process
        assert r["ray_worker_id"] and r["ray_node_id"]
        assert r["pid"] != os.getpid()
        workers.add(r["ray_worker_id"])
    here = local_ray.get_runtime_context().get_worker_id()  # the driver's own id
    assert here not in workers
    for r in shown(pool):  # the pool's ran in its worker processes, with no Ray ids
        assert "ray_worker_id" not in r and r["pid"] != os.getpid()


def test_ray_asked_for_and_missing_is_an_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    rc = main(["plan", *GRID, *WORKLOAD, "--slo", SLO, "--ray", "local", "--json"])
    assert rc == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing ran
    err = json.loads(captured.err.strip().splitlines()[-1])
    assert "doppelchip[ray]" in err["error"] and "not installed" in err["error"]
