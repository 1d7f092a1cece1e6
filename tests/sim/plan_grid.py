"""The tiny grid the plan tests search and brute-force: 4 configs (RTX 4090 with vLLM, BF16
or FP8, TP 1 or 2) × 1-4 replicas at 100 req/s, where the cheapest fleet meeting the SLO needs
more than one replica and a config's cheapest passing count differs between configs."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

from doppelchip.cli import main

WORKLOAD = ["--isl", "256", "--osl", "64", "--ignore-eos", "--num-requests", "100",
            "--rate", "100"]
SLO = "ttft=0.1,tpot=0.02"
GRID = ["--model", "llama-3.1-8b", "--chips", "rtx-4090", "--engines", "vllm",
        "--quants", "bf16,fp8", "--tp", "1,2", "--max-replicas", "4", "--runners-up", "2"]


def plan_json(*extra: str) -> dict:
    """`doppelchip plan` on the grid, in this process: its last line, one JSON object."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["plan", *GRID, *WORKLOAD, "--slo", SLO, "--json", *extra])
    out = buf.getvalue().strip().splitlines()
    assert rc == 0, out
    return json.loads(out[-1])


def run_command(command: str) -> dict:
    """A printed `doppelchip ...` command, run as a new process: its last JSON line."""
    import shlex

    argv = shlex.split(command)
    assert argv[0] == "doppelchip"
    proc = subprocess.run([sys.executable, "-m", "doppelchip.cli", *argv[1:]],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])
