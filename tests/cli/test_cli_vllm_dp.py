"""Which data-parallel ranks a `vllm serve` pod runs, from vLLM 0.33.0's launch flags
(doppelchip/vllm_dp.py): internal, hybrid and external load balancing, ranks inferred from
`--nnodes`/`--node-rank`, vLLM's refusals in its words, and `--headless` workers that idle
while the leader's pod emulates their ranks."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest

from doppelchip.cli import build_parser
from doppelchip.cmd_vllm import translate
from doppelchip.vllm_argv import vllm_argv
from doppelchip.vllm_dp import HEADLESS

MOE = "Qwen/Qwen3-30B-A3B"
DENSE = "meta-llama/Llama-3.1-8B-Instruct"
PARSER = build_parser("vllm")


def ranks(*argv: str, repo: str = MOE) -> tuple[int, int, int]:
    """(first rank, ranks run here, data-parallel size) of the `doppelchip serve` command."""
    out, _ = translate(PARSER.parse_args(vllm_argv(["vllm", "serve", repo, *argv], set())))

    def flag(name: str, default: int) -> int:
        return int(out[out.index(name) + 1]) if name in out else default

    size = flag("--data-parallel-size", 1)
    return (flag("--data-parallel-start-rank", 0), flag("--data-parallel-size-local", size),
            size)


@pytest.mark.parametrize("argv, expected", [
    (["-dp", "8"], (0, 8, 8)),  # internal LB: every rank behind one API server
    (["-dp", "8", "--data-parallel-rank", "3"], (3, 1, 8)),  # external LB: one rank
    (["-dp", "8", "-dpn", "5", "--data-parallel-external-lb"], (5, 1, 8)),
    (["-dp", "8", "-dpl", "4", "-dpr", "4"], (4, 4, 8)),  # hybrid: a node's ranks
    (["-dp", "8", "-dpl", "4", "--data-parallel-hybrid-lb"], (0, 4, 8)),
    (["-dp", "8", "-dpl", "1", "-dpr", "6"], (6, 1, 8)),  # hybrid of one rank = external
    (["-dp", "8", "-dpl", "4"], (0, 8, 8)),  # internal LB, remote ranks headless: the
    #                                          leader's pod emulates them too
    (["-dp", "8", "-dpl", "8", "-dpr", "0"], (0, 8, 8)),  # all local: not hybrid
    (["-dp", "8", "--nnodes", "8", "--node-rank", "2", "-dpe"], (2, 1, 8)),  # rank inferred
    (["-dp", "8", "-tp", "2", "--nnodes", "4", "--node-rank", "1", "-dph"], (2, 2, 8)),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_the_ranks_a_pod_runs_are_vllms(argv, expected):
    assert ranks(*argv) == expected


@pytest.mark.parametrize("argv, says", [
    (["-dp", "2", "--data-parallel-rank", "1"], "Non-MoE models do not support external"),
    (["-dp", "8", "--data-parallel-rank", "1", "-dpr", "1"],
     "Cannot use more than one data parallel load balancing mode"),
    (["-dp", "8", "-dph", "-dpe", "-dpn", "1"], "cannot be enabled together"),
    (["-dp", "8", "-dpn", "1", "-dpl", "2"], "requires `--data-parallel-size-local 1`"),
    (["-dp", "8", "-dph"], "requires `--data-parallel-size-local`"),
    (["-dp", "8", "-dpe"], "requires a data-parallel rank"),
    (["-dp", "16", "--nnodes", "4", "--node-rank", "1", "-dpe"], "cannot unambiguously"),
    (["-dp", "2", "--nnodes", "4", "--node-rank", "1"], "must evenly divide"),
    (["-dp", "8", "--nnodes", "2", "--node-rank", "2"], "`--node-rank` must be between"),
    (["-dp", "8", "-dpn", "8"], "outside the 8 of --data-parallel-size"),
    (["-dp", "8", "-dpl", "4", "-dph", "--headless"], "not applicable in headless mode"),
    # vLLM 0.34.0's --enable-fault-tolerance: external load balancing and one API server
    (["-dp", "8", "--enable-fault-tolerance"], "Fault tolerance requires external load "
                                               "balancer mode"),
    (["--enable-fault-tolerance"], "Internal LB mode is not supported"),
    (["-dp", "8", "--data-parallel-rank", "2", "--api-server-count", "2",
      "--enable-fault-tolerance"],
     "Fault tolerance requires a single API server process (--api-server-count=1), but got 2"),
])
def test_launch_modes_vllm_refuses_are_refused_in_its_words(argv, says):
    repo = DENSE if "Non-MoE" in says else MOE
    with pytest.raises(ValueError, match=re.escape(says)):
        ranks(*argv, repo=repo)


def test_a_dense_model_may_still_run_data_parallel_replicas_behind_one_server():
    assert ranks("-dp", "2", repo=DENSE) == (0, 2, 2)


def test_fault_tolerance_starts_an_external_rank_and_passes_its_flags_through():
    argv = ["-dp", "8", "--data-parallel-rank", "5", "--enable-fault-tolerance"]
    assert ranks(*argv) == (5, 1, 8)
    out, warnings = translate(PARSER.parse_args(vllm_argv(["vllm", "serve", MOE, *argv],
                                                          set())))
    assert "--enable-fault-tolerance" in out and warnings == []
    # a config alone turns fault tolerance on (vLLM's EngineArgs), with its refusals
    config = ["--fault-tolerance-config", '{"engine_recovery_timeout_sec": 30}']
    with pytest.raises(ValueError, match="Internal LB mode is not supported"):
        ranks(*config)
    out, warnings = translate(PARSER.parse_args(vllm_argv(
        ["vllm", "serve", MOE, *config, "--data-parallel-rank", "0"], set())))
    assert out[out.index("--fault-tolerance-config") + 1] == config[1]
    assert warnings == ["--fault-tolerance-config was passed. Fault tolerance is being "
                        "automatically enabled."]


def test_a_headless_worker_idles_until_sigterm_and_exits_cleanly():
    cmd = [sys.executable, "-m", "doppelchip.cli", "vllm", "serve", MOE, "-dp", "8", "-dpl",
           "4", "-dpr", "4", "--headless", "--port", "0"]
    with subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:  # it says what it is, then waits (no engine, no listener)
            if HEADLESS in line:
                break
        else:
            pytest.fail(f"exited {proc.wait()} without saying it idles")
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
