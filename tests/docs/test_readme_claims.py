"""README's pre-vLLM baseline shows the gap its prose claims: the two commands README runs
(the same traffic through paged + continuous and through contiguous + static), not a copy."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from doppelchip.cli import main
from scripts.doccheck.blocks import shell_blocks

ROOT = Path(__file__).resolve().parents[2]


def baseline_commands() -> list[list[str]]:
    [block] = [b for b in shell_blocks(ROOT / "README.md")
               if len(b.commands) == 2 and "--batching static" in b.commands[1]]
    # the words before the `| grep` that keeps README's quote short
    return [shlex.split(c.replace("\\\n", " ").split("|")[0])[1:] for c in block.commands]


def test_the_baseline_serves_fewer_and_later_than_paged_continuous(capsys):
    summaries = []
    for argv in baseline_commands():
        assert main([*argv, "--json"]) == 0
        summaries.append(json.loads(capsys.readouterr().out.strip().split("\n")[-1]))
    paged, baseline = summaries
    assert "--rate" in baseline_commands()[1]  # a stated rate, not everything at t=0
    # paging: the contiguous reservation fills the KV cache with fewer running sequences
    assert baseline["kv_usage_peak"] > 0.95 > paged["kv_usage_peak"]
    assert baseline["peak_running"] < 0.5 * paged["peak_running"]
    # batching: a static batch admits no one until it is done
    assert baseline["requests_per_s"] < 0.7 * paged["requests_per_s"]
    assert baseline["ttft_s"]["mean"] > 5 * paged["ttft_s"]["mean"]
