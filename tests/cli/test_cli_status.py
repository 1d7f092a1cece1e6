"""`doppelchip status` against a real server whose first deployment cannot be placed: the
states, capacity and load it prints are the server's, the FAILED deployment is not the
default (and the log says which one is, and why), failures exit 1 with the status name."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from server_proc import ServerProcess

from clients.client import Client
from server.fleet import choose_default

CLI = [sys.executable, "-m", "doppelchip.cli"]

FLEET = {
    "server": {"time_scale": 0.05, "drain_grace_s": 5.0},  # no default_deployment: the first
    "deployments": [
        # 70B in bf16 (~140 GB of weights) on one 24 GB RTX 4090: cannot be placed
        {"name": "toobig", "model": "llama-3.1-70b", "quant": "bf16", "chip": "rtx-4090",
         "engine": "vllm"},
        {"name": "fast", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
         "engine": "vllm", "max_model_len": 256},
        {"name": "slow", "model": "llama-3.1-70b", "quant": "q4_k_m", "chip": "rtx-4090",
         "engine": "llama.cpp", "max_num_seqs": 1},
    ],
}


@pytest.fixture(scope="module")
def server():
    with ServerProcess(FLEET) as s:
        yield s


def cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=timeout)


def status_json(server: ServerProcess) -> dict:
    out = cli("status", "--target", server.target, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])  # the last line is the object


def test_a_failed_first_deployment_is_not_the_default_and_the_log_says_why(server):
    line = server.wait_for_log(r"default deployment: ")
    assert "default deployment: fast (the first deployment listed 'toobig' could not be " \
           "placed (" in line, line
    with Client(server.target) as client:
        listing = client.list_deployments()
        assert listing.default_deployment == "fast"
        chunks = list(client.generate("plain request", max_tokens=3, ignore_eos=True))
    assert chunks[-1].final.deployment == "fast"  # a request naming no deployment succeeds


@pytest.mark.parametrize(("configured", "explicit", "placed", "expected"), [
    ("a", True, [("a", True, ""), ("b", True, "")], ("a", "default_deployment, placed")),
    ("b", True, [("a", True, ""), ("b", False, "no fit")],
     ("a", "default_deployment 'b' could not be placed (no fit); 'a' is the first deployment "
      "that was")),
    ("a", False, [("a", False, "x"), ("b", False, "y"), ("c", True, "")],
     ("c", "the first deployment listed 'a' could not be placed (x); 'c' is the first "
      "deployment that was")),
    ("a", False, [("a", False, "x"), ("b", False, "y")],
     ("a", "the first deployment listed; no deployment could be placed")),
])
def test_choose_default(configured, explicit, placed, expected):
    assert choose_default(configured, explicit, placed) == expected


def test_status_json_reports_states_capacity_and_load(server):
    with Client(server.target) as client:
        truth = {d.name: d for d in client.list_deployments().deployments}
        # a request in flight on `slow`: the status must show it running and its KV in use
        stream = client.generate("keep me busy", deployment="slow", max_tokens=300,
                                 ignore_eos=True)
        assert next(stream).token_ids  # it is running once its first token arrived
        try:
            status = status_json(server)
        finally:
            stream.close()  # cancels the call
    rows = {d["name"]: d for d in status["deployments"]}
    assert list(rows) == ["toobig", "fast", "slow"]
    assert status["default_deployment"] == "fast" and status["health"] == "SERVING"
    assert status["time_scale"] == 0.05 and status["http_port"] == server.http_port
    assert rows["toobig"]["state"] == "FAILED" and rows["toobig"]["state_message"]
    assert not rows["toobig"]["is_default"] and rows["fast"]["is_default"]
    assert rows["fast"]["state"] == rows["slow"]["state"] == "READY"
    for name in ("fast", "slow"):
        cap, want = rows[name]["capacity"], truth[name].capacity
        assert cap["kv_blocks_total"] == want.kv_blocks_total > 0
        assert cap["kv_tokens"] == want.kv_blocks_total * want.block_size
        assert cap["max_num_seqs"] == want.max_num_seqs
        assert cap["max_model_len"] == want.max_model_len
    assert rows["slow"]["capacity"]["max_num_seqs"] == 1
    assert rows["fast"]["capacity"]["max_model_len"] == 256
    busy = rows["slow"]["load"]
    assert busy["running"] == 1 and busy["waiting"] == 0
    assert 0 < busy["kv_usage"] <= 1
    assert rows["fast"]["load"] == {"running": 0, "waiting": 0, "kv_usage": 0}


def test_status_table(server):
    out = cli("status", "--target", server.target)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"server {server.target}: SERVING, time scale 0.05")
    fast = next(x for x in lines if x.startswith("fast *"))
    assert re.search(r"\bREADY\b.*llama-3\.1-8b bf16.*vllm.*1x h100-sxm", fast), fast
    assert re.search(r"^toobig\s+FAILED\b", "\n".join(lines), re.M)
    assert any(x.startswith("toobig: FAILED: ") for x in lines)  # and why


def test_status_of_an_unreachable_server_exits_1_with_the_status_name():
    from server_proc import free_run

    out = cli("status", "--target", f"127.0.0.1:{free_run(1)}", "--timeout", "2")
    assert out.returncode == 1
    assert re.search(r"^error: (UNAVAILABLE|DEADLINE_EXCEEDED): ", out.stderr, re.M), out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_a_sleeping_pod_shows_as_sleeping():
    """Sleep mode has no wire-API state: `status` reads it from the pod's /metrics."""
    import urllib.request

    pod = ["--deployment", "pod", "--chip", "h100-sxm", "--engine", "vllm", "--model",
           "llama-3.1-8b", "--quant", "bf16", "--time-scale", "0.05", "--enable-sleep-mode"]
    with ServerProcess(None, *pod) as s:
        assert [d["state"] for d in status_json(s)["deployments"]] == ["READY"]
        req = urllib.request.Request(f"{s.http_url}/sleep?level=1", method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
        status = status_json(s)
        assert status["sleep_state_known"] is True
        assert [d["state"] for d in status["deployments"]] == ["SLEEPING"]


def test_a_load_whose_every_request_fails_exits_1(server):
    out = cli("load", "--target", server.target, "--deployment", "toobig", "--num-requests",
              "3", "--json")
    assert out.returncode == 1, out.stderr
    summary = json.loads(out.stdout.splitlines()[-1])  # still the report, as the last line
    assert summary["requests"] == 0 and sum(summary["errors"].values()) == 3
