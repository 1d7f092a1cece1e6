"""vLLM's profiling routes on a real pod (`--profiler-config`, `/start_profile`, `/stop_profile`):
each engine core writes its emulated steps as a torch-profiler trace, named as vLLM's worker
names it, whose steps are exactly the engine's (checked against the pod's own metrics), with
vLLM's session rules (delay and max iterations, prefix, the 409) and refusals."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from server_proc import ROOT, ServerProcess, metric

POD = ["--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-3.1-8b", "--quant", "fp8",
       "--max-model-len", "1024", "--time-scale", "0.05"]
STEP = "gpu_user_annotation"
NAME = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")


@pytest.fixture(scope="module")
def pod(tmp_path_factory):
    directory = tmp_path_factory.mktemp("traces")
    config = json.dumps({"profiler": "torch", "torch_profiler_dir": str(directory)})
    with ServerProcess(None, *POD, "--profiler-config", config) as server:
        server.traces = directory
        yield server


def traces(directory: Path) -> set[Path]:
    return set(directory.iterdir())


def load(path: Path) -> list[dict]:
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return json.loads(data)["traceEvents"]


def complete(http: httpx.Client, first: int, tokens: int = 8) -> None:
    r = http.post("/v1/completions", json={"prompt": [first] * 100, "max_tokens": tokens,
                                           "ignore_eos": True})
    assert r.status_code == 200, r.text


def steps_and_busy(pod) -> tuple[float, float]:
    text = pod.scrape()
    return (metric(text, "vllm:iteration_tokens_total_count"),
            metric(text, "doppelchip_busy_seconds_total"))


def test_a_session_traces_every_step_of_the_engine(pod):
    before = traces(pod.traces)
    with httpx.Client(base_url=pod.http_url, timeout=60) as http:
        steps0, busy0 = steps_and_busy(pod)
        assert http.post("/start_profile").status_code == 200
        for i in range(3):  # three distinct 100-token prompts, 8 tokens each
            complete(http, 10 + i)
        steps1, busy1 = steps_and_busy(pod)
        r = http.post("/stop_profile")
        assert r.status_code == 200 and r.content == b""
    (path,) = traces(pod.traces) - before
    assert re.fullmatch(r"dp0_pp0_tp0_dcp0_ep0_rank0\.\d{13}\.pt\.trace\.json\.gz", path.name)
    events = load(path)
    steps = [e for e in events if e.get("cat") == STEP]
    assert len(steps) == steps1 - steps0  # every engine step of the session, no other
    assert sum(e["dur"] for e in steps) / 1e6 == pytest.approx(busy1 - busy0, rel=1e-9)
    counts = [tuple(map(int, NAME.fullmatch(e["name"]).groups())) for e in steps]
    assert sum(c[1] for c in counts) == 300  # context tokens: the prompts, computed once
    assert sum(c[3] for c in counts) == 3 * 7  # generation tokens: decodes after the first
    assert all(e["args"]["bound"] in ("memory", "compute", "overhead", "link") for e in steps)
    assert all(e["args"]["bytes"] and e["args"]["flops"] > 0 for e in steps)
    starts = [e["ts"] for e in steps]
    assert starts == sorted(starts)  # one track, in the emulated timeline's order
    assert {e["name"] for e in events if e["ph"] == "C"} == {"batch", "kv_cache_usage"}


def wait_for_trace(directory: Path, before: set[Path], timeout: float = 30.0) -> Path:
    """The trace an engine writes by itself (max_iterations reached), polled for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = traces(directory) - before
        if new:
            return new.pop()
        time.sleep(0.02)
    raise AssertionError("no trace was written")


def test_max_iterations_ends_the_session_and_a_prefix_names_the_file(pod):
    before = traces(pod.traces)
    with httpx.Client(base_url=pod.http_url, timeout=60) as http:
        r = http.post("/start_profile", json={"profile_prefix": "run.1", "max_iterations": 3,
                                              "profiler_kwargs": {"x": 1}, "other": True})
        assert r.status_code == 200
        complete(http, 20)  # 8 steps
        path = wait_for_trace(pod.traces, before)
        assert path.name.startswith("run.1_dp0_pp0_tp0_dcp0_ep0_rank0.")
        assert len([e for e in load(path) if e.get("cat") == STEP]) == 3
        assert http.post("/stop_profile").status_code == 200  # nothing left to write
        assert http.post("/stop_profile").status_code == 200  # not started: a no-op, as vLLM
    assert traces(pod.traces) - before == {path}


def test_delay_iterations_records_from_that_step_on(pod):
    before = traces(pod.traces)
    with httpx.Client(base_url=pod.http_url, timeout=60) as http:
        assert http.post("/start_profile", json={"delay_iterations": 2}).status_code == 200
        complete(http, 30)  # 8 steps: the first is not recorded
        assert http.post("/stop_profile").status_code == 200
    (path,) = traces(pod.traces) - before
    assert len([e for e in load(path) if e.get("cat") == STEP]) == 7


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"profile_prefix": "-x"}, 400, "profile_prefix must be 1-128 ASCII characters"),
    ({"profile_prefix": "a/b"}, 400, "profile_prefix must be 1-128 ASCII characters"),
    ({"delay_iterations": -1}, 400, "delay_iterations must be greater than or equal to 0"),
    ({"max_iterations": -2}, 400, "max_iterations must be greater than or equal to 0"),
    ({"max_iterations": "3"}, 400, "max_iterations"),  # strict types, as vLLM's model
])
def test_bad_sessions_are_refused(pod, body, status, message):
    with httpx.Client(base_url=pod.http_url, timeout=60) as http:
        r = http.post("/start_profile", json=body)
    assert r.status_code == status and message in r.text


def test_a_second_start_is_a_conflict(pod):
    with httpx.Client(base_url=pod.http_url, timeout=60) as http:
        assert http.post("/start_profile").status_code == 200
        r = http.post("/start_profile")
        assert r.status_code == 409 and r.json()["error"] == {
            "message": "A profiling session is already active. Call /stop_profile before "
                       "starting another session.", "type": "Conflict", "param": None,
            "code": 409}
        assert http.post("/stop_profile").status_code == 200


def test_without_the_config_the_routes_do_not_exist():
    with ServerProcess(None, *POD) as server, httpx.Client(base_url=server.http_url) as http:
        assert http.post("/start_profile").status_code == 404
        assert http.post("/stop_profile").status_code == 404


@pytest.mark.parametrize(("config", "message"), [
    ('{"profiler": "cuda"}', "profiler 'cuda' profiles hardware an emulated engine does not"),
    ('{"profiler": "torch"}', "torch_profiler_dir must be set when profiler is 'torch'"),
    ('{"torch_profiler_dir": "/tmp/x"}', "torch_profiler_dir is only applicable when"),
    ('{"profiler": "torch", "torch_profiler_dir": "/tmp/x", "colour": 1}', "unknown key(s)"),
    ('{"profiler": "torch", "torch_profiler_dir": "s3://b/p"}', "must be a local directory"),
])
def test_a_bad_profiler_config_stops_the_server(config, message):
    r = subprocess.run([sys.executable, "-m", "doppelchip.cli", "serve", "--port", "0",
                        "--http-port", "0", "--profiler-config", config],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def _profiler(name: str, directory: Path, pod: bool):
    from server.engine.options import EngineOptions
    from server.engine.profiler_config import ProfilerConfig
    from server.engine_proc.info import failed_info
    from server.engine_proc.profiler import StepProfiler

    info = failed_info(EngineOptions(name=name, model="llama-3.1-8b", quant="bf16",
                                     chip="h100-sxm", engine="vllm"), 0, "", 100)
    config = ProfilerConfig("torch", str(directory))
    return StepProfiler(config, info, pod)


def test_a_fleets_deployments_write_apart_in_the_same_millisecond(tmp_path, monkeypatch):
    """Every deployment of a fleet has a rank 0: in one directory, at one millisecond, their
    traces must not collide (a pod keeps vLLM's name)."""
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_000_000_000)
    paths = []
    for name in ("a", "b"):
        p = _profiler(name, tmp_path, pod=False)
        p.start(None, None, None)
        paths.append(p.stop())
    assert [Path(x).name for x in paths] == [
        f"{n}_dp0_pp0_tp0_dcp0_ep0_rank0.1700000000000.pt.trace.json.gz" for n in "ab"]
    assert len(list(tmp_path.iterdir())) == 2
    pod = _profiler("a", tmp_path / "pod", pod=True)
    pod.start("run", None, None)
    assert Path(pod.stop()).name.startswith("run_dp0_pp0_tp0_dcp0_ep0_rank0.")


def test_a_trace_that_cannot_be_written_does_not_stop_the_engine(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    p = _profiler("a", blocked, pod=True)
    p.start(None, None, None)
    assert p.stop() is None and not p.active  # logged; the session is over
