"""Start-up (issue 16): a one-request `doppelchip simulate` loads only what it runs — no
grammar engine without a structured workload, no gateway/HTTP client, no gRPC, no cluster
modules without a router, and the tokenizer's vocabulary is not parsed when only ids are
drawn. Each check runs the command in a fresh interpreter (what a user starts) and lists what
it imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEPLOYMENT = ["--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-2-7b",
              "--quant", "bf16"]
PROBE = """
import contextlib, io, json, sys
from doppelchip.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    rc = main(sys.argv[1:])
from server.engine.tokenizer import get_tokenizer
print(json.dumps({"rc": rc, "modules": sorted(sys.modules),
                  "vocabulary_parsed": "_tok" in vars(get_tokenizer())}))
"""


def _run(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, "simulate", *DEPLOYMENT, *args],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return json.loads(out.splitlines()[-1])


def test_plain_simulate_loads_no_grammar_engine_gateway_or_grpc():
    got = _run("--num-requests", "1")
    assert got["rc"] == 0
    loaded = set(got["modules"])
    for absent in ("llguidance", "urllib.request", "http.client", "grpc",
                   "doppelchip.cmd_gateway", "doppelchip.cmd_load", "sim.cluster", "tokenizers",
                   "sim.autoscaled", "tomllib", "tempfile"):
        assert absent not in loaded, absent
    assert not got["vocabulary_parsed"]


def test_a_routed_run_loads_the_cluster():
    got = _run("--router", "round-robin", "--num-requests", "2")
    assert got["rc"] == 0
    assert {"sim.cluster", "sim.autoscaled"} <= set(got["modules"])


def test_structured_workload_loads_what_it_needs():
    """The other side of the laziness: a structured workload still compiles grammars."""
    got = _run("--workload", "structured", "--num-requests", "2")
    assert got["rc"] == 0
    assert {"llguidance", "tokenizers"} <= set(got["modules"])
    assert got["vocabulary_parsed"]
