"""`doppelchip plan --ray local`: on the local Ray instance the command starts (2 CPUs on
127.0.0.1, a temporary directory of this test's, shut down after) the plan is the process
pool's, and every candidate ran in a Ray worker process, not in the command's own. Without
Ray, `--ray` is an error, never a silent fallback to the pool."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest
from plan_grid import GRID, SLO, WORKLOAD

from doppelchip.cli import main
from sim.plan_exec import check_reachable

SAME = ("deployment", "replicas", "chips", "usd_per_hour", "usd_per_mtok", "latency",
        "goodput_fraction", "fleet", "simulate_command")


def plan_in_a_new_process(*extra: str, tmp: str) -> dict:
    """`doppelchip plan` on the grid as a command of its own: Ray's local instance starts
    from a process without this suite's threads (grpc, servers), as a user's would."""
    env = {**os.environ, "RAY_TMPDIR": tmp}  # short: Ray's unix sockets live under it
    argv = [sys.executable, "-m", "doppelchip.cli", "plan", *GRID, *WORKLOAD, "--slo", SLO,
            "--json", *extra]
    for _ in range(2):  # Ray gives its raylet 30 s to register: a loaded machine may not
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
        if proc.returncode == 0 or "cannot start or reach Ray" not in proc.stderr:
            break
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def shown(plan: dict) -> list[dict]:
    return [plan, *plan["runners_up"], *plan["frontier"]]


def test_ray_gives_the_pools_answer_from_ray_workers():
    pytest.importorskip("ray", reason="doppelchip[ray] is not installed (make install-dev)")
    tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    try:
        pool = plan_in_a_new_process("--jobs", "2", tmp=tmp)
        on_ray = plan_in_a_new_process("--ray", "local", tmp=tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert on_ray["executor"]["name"] == "ray" and pool["executor"]["name"] == "process pool"
    assert {k: on_ray[k] for k in SAME} == {k: pool[k] for k in SAME}
    for key in ("runners_up", "frontier"):
        assert [{k: r[k] for k in SAME} for r in on_ray[key]] == \
            [{k: r[k] for k in SAME} for r in pool[key]]
    driver = on_ray["executor"]
    assert driver["driver_worker_id"]
    for r in shown(on_ray):  # each ran in a Ray worker: a worker id, another process
        assert r["ray_worker_id"] and r["ray_node_id"]
        assert r["ray_worker_id"] != driver["driver_worker_id"]
        assert r["pid"] != driver["driver_pid"]
    for r in shown(pool):  # the pool's ran in its worker processes, with no Ray ids
        assert "ray_worker_id" not in r and r["pid"] != pool["executor"]["driver_pid"]


def test_ray_asked_for_and_missing_is_an_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    rc = main(["plan", *GRID, *WORKLOAD, "--slo", SLO, "--ray", "local", "--json"])
    assert rc == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing ran
    err = json.loads(captured.err.strip().splitlines()[-1])
    assert "doppelchip[ray]" in err["error"] and "not installed" in err["error"]


def test_a_head_that_does_not_answer_is_refused_at_once(capsys):
    """`--ray host:port` with nothing listening there: a clear error before `ray.init`,
    which would retry a dead head for minutes."""
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionError, match="nothing answers"):
        check_reachable(f"ray://127.0.0.1:{port}")
    check_reachable("auto")  # Ray's own to resolve: not checked here
    rc = main(["plan", *GRID, *WORKLOAD, "--slo", SLO, "--ray", f"127.0.0.1:{port}", "--json"])
    assert rc == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = json.loads(captured.err.strip().splitlines()[-1])
    assert "cannot start or reach Ray" in err["error"] and "nothing answers" in err["error"]
