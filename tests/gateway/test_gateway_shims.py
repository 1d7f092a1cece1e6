"""The container image's module shims (deploy/shims/), run the way launchers run them, with
the folder on PYTHONPATH as the image puts it: `python -m sglang.launch_server ...` starts an
SGLang pod, and smg's own TensorRT-LLM launcher (`smg serve --backend trtllm`, which runs
`python -m tensorrt_llm.commands.serve MODEL --grpc ...`) starts a TensorRT-LLM pod it fronts.
A shim without its `__main__` guard starts a second server in the pod's worker processes
(they re-import the main module by name) and the pod never places its deployment."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gateway_harness import OFFLINE, SMG, free_port, http, stop_group

ROOT = Path(__file__).resolve().parents[2]
SHIMS = ROOT / "deploy" / "shims"


def quiet_pair() -> int:
    """A port P with P + 1 free too, below the kernel's ephemeral range (32768-60999) and
    the docs checker's (10000-32699): the pod binds P + 1 for HTTP itself, and an ephemeral
    port next to a free one can be taken by any outgoing connection meanwhile."""
    rng = random.Random()
    for _ in range(200):
        p = rng.randrange(4000, 9900)
        if all(_bindable(p + i) for i in (0, 1)):
            return p
    raise RuntimeError("no two free consecutive ports in 4000-9900")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def started(cmd: list[str], url: str, log: Path, ready, deadline_s: float = 60.0
            ) -> subprocess.Popen:
    """`cmd` with the shims on PYTHONPATH, once GET `url` satisfies `ready` (a deadline, not a
    sleep: it polls)."""
    env = {**os.environ, **OFFLINE, "PYTHONPATH": str(SHIMS)}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            status, body = http("GET", url, timeout=2)
        except OSError:
            status, body = 0, None
        if ready(status, body):
            return proc
        time.sleep(0.2)
    stop_group(proc, timeout=30)
    raise AssertionError(f"not ready: {' '.join(cmd)}\n{log.read_text(errors='replace')[-4000:]}")


def test_sglang_launch_server_module_starts_an_sglang_pod(tmp_path):
    port = free_port()
    proc = started([sys.executable, "-m", "sglang.launch_server", "--model-path",
                    "meta-llama/Llama-3.1-8B-Instruct", "--host", "127.0.0.1", "--port",
                    str(port), "--grpc-port", str(free_port())],
                   f"http://127.0.0.1:{port}/model_info", tmp_path / "sglang.log",
                   lambda status, body: status == 200)
    try:
        status, body = http("POST", f"http://127.0.0.1:{port}/generate", {
            "text": "hi", "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
        assert status == 200 and len(body["output_ids"]) == 3, body
    finally:
        assert stop_group(proc, timeout=30) == 0


@pytest.mark.skipif(SMG is None, reason="smg is not installed (make install-dev)")
def test_smgs_trtllm_launcher_starts_a_trtllm_pod_through_the_module(tmp_path):
    port, prometheus, worker = free_port(), free_port(), quiet_pair()
    proc = started([SMG, "serve", "--backend", "trtllm", "--model", "llama-3.1-8b", "--host",
                    "127.0.0.1", "--port", str(port), "--worker-host", "127.0.0.1",
                    "--worker-base-port", str(worker), "--router-prometheus-host", "127.0.0.1",
                    "--router-prometheus-port", str(prometheus)],
                   f"http://127.0.0.1:{port}/readiness", tmp_path / "smg.log",
                   lambda status, body: status == 200 and body.get("healthy_workers") == 1)
    try:
        status, workers = http("GET", f"http://127.0.0.1:{port}/workers")
        assert [(w["runtime_type"], w["connection_mode"]) for w in workers["workers"]] == \
            [("trtllm", "grpc")]
        status, out = http("POST", f"http://127.0.0.1:{port}/v1/completions", {
            "model": "llama-3.1-8b", "prompt": "hello", "max_tokens": 4, "ignore_eos": True})
        assert status == 200 and out["usage"]["completion_tokens"] == 4, out
    finally:
        stop_group(proc, timeout=30)
    log = (tmp_path / "smg.log").read_text(errors="replace")
    assert "doppelchip serve --chip h100-sxm --engine tensorrt-llm --grpc-api trtllm" in log
