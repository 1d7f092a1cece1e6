"""Sizes too large to simulate (lengths past any model's context, prefixes and conversations
that would not fit in memory, a closed loop wider than its workload, rates past a float, a
timeline of too many samples): a clear `error:` line (exit 2), or a run that does what it
can — never a MemoryError, an overflow traceback or a loop that runs for ever."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_cli_bad_input import LOAD, ROOT, SIM, usage_error

from doppelchip.cli import main


def test_lengths_past_any_context_are_refused_not_drawn(capsys: pytest.CaptureFixture[str]):
    # 1e20 tokens overflowed NumPy's draw (a traceback)
    line = usage_error(capsys, [*SIM, "--isl", str(10**20), "--num-requests", "3"])
    assert "isl and osl must be at most 16777216 tokens" in line
    # plan gave SRAM candidates a max_model_len past the model's and simulated them for ever
    assert main(["plan", "--chips", "groq-lpu-v1", "--engines", "groq", "--isl", "200000",
                 "--rate", "1", "--slo", "ttft=1", "--json"]) == 1
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["searched"]["simulated"] == 0
    assert all("greater than the derived max_model_len" in p["why"] for p in out["pruned"])


@pytest.mark.parametrize(("argv", "says"), [  # a MemoryError, an OverflowError, nonsense
    (["--workload", "shared-prefix", "--system-prompt-len", str(10**9)], "the shared prefixes"),
    (["--workload", "shared-prefix", "--num-prefixes", str(10**9)], "the shared prefixes"),
    (["--workload", "multi-turn", "--turns", str(10**9)], "a conversation of 1000000000 turns"),
    (["--workload", "multi-turn", "--think-time", "1e308"], "--think-time must be"),
    # arrivals 1e300 s apart: a report of durations of 1e301 s and a TTFT p50 of 0.00 (the
    # arrival plus a prefill's milliseconds rounds back to the arrival at 1e300)
    (["--rate", "1e-300"], "--rate 1e-300 spreads 3 arrivals over ~3e+300 s"),
    (["--rate", "1e-9"], "past 1e+09 s"),
])
def test_sizes_past_what_a_run_can_hold_are_refused(capsys: pytest.CaptureFixture[str],
                                                  argv: list[str], says: str):
    assert says in usage_error(capsys, [*SIM, *argv, "--num-requests", "3"])


def test_a_closed_loop_wider_than_the_workload_starts_what_there_is():
    # --concurrency 1e9 of 5 requests tried to start a billion sessions before the first step
    done = subprocess.run([sys.executable, "-m", "doppelchip.cli", "load", "--target",
                           "sim:vllm-h100", "--num-requests", "5", "--concurrency", str(10**9),
                           "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["requests"] == 5


def test_an_absurd_sweep_rate_saturates_instead_of_failing(capsys: pytest.CaptureFixture[str]):
    # the first rate's request count was rate × 0 s of service: inf × 0, NaN, a traceback
    assert main([*LOAD, "--num-requests", "5", "--sweep-rates", "1e308"]) == 0
    assert "saturated at 1e+308 req/s" in capsys.readouterr().out


def test_a_timeline_of_too_many_samples_is_refused_during_the_run(
        capsys: pytest.CaptureFixture[str]):
    line = usage_error(capsys, [*SIM, "--num-requests", "3", "--timeline", "1e-9"])
    assert "more than 200000 autoscaler syncs and timeline samples" in line
