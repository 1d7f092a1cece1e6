"""`doppelchip simulate`: the JSON summary's keys, every workload, and clear errors."""

from __future__ import annotations

import json

import pytest

from doppelchip.cli import main

KEYS = {"requests", "duration_s", "requests_per_s", "output_tokens_per_s",
        "prefix_cache_hit_rate", "preemptions", "compile_stall_s", "joules_per_mtok",
        "usd_per_mtok"}


def run(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["simulate", *argv, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out if code == 0 else captured.err)


@pytest.mark.parametrize("workload", ["random", "shared-prefix", "multi-turn"])
def test_json_summary_for_every_workload(capsys, workload):
    # 16-token KV blocks: a first turn of 32 + 8 tokens fills whole blocks the second turn can
    # hit (a 64-token block, vLLM 0.34.0's default, would hold none of it)
    code, s = run(capsys, "--workload", workload, "--num-requests", "12", "--isl", "32",
                  "--osl", "8", "--ignore-eos", "--system-prompt-len", "64", "--turns", "2",
                  "--rate", "50", "--block-size", "16")
    assert code == 0
    assert set(s) >= KEYS
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert {"mean", "p50", "p90", "p99"} <= set(s[key])
        assert 0 < s[key]["p50"] <= s[key]["p99"]
    turns = 2 if workload == "multi-turn" else 1
    assert s["requests"] == 12 * turns and s["output_tokens"] == 12 * turns * 8
    assert s["joules_per_mtok"] > 0 and s["usd_per_mtok"] > 0
    if workload == "multi-turn":  # the second turn resends the first: its prefix is cached
        assert s["cached_prompt_tokens"] > 0


def test_multi_turn_history_hits_the_cache_only_with_it_on(capsys):
    # 16-token KV blocks: a turn's history (48 + 16 tokens a turn) hits the cache by whole
    # blocks, most of it in 16-token blocks (in 64-token ones, vLLM 0.34.0's, under half)
    args = ["--workload", "multi-turn", "--num-requests", "6", "--isl", "48", "--osl", "16",
            "--turns", "3", "--ignore-eos", "--block-size", "16"]
    _, on = run(capsys, *args, "--prefix-cache", "on")
    _, off = run(capsys, *args, "--prefix-cache", "off")
    assert on["prefix_cache_hit_rate"] > 0.3 and off["prefix_cache_hit_rate"] == 0
    assert on["prefill_tokens"] < off["prefill_tokens"]


def test_flags_pick_a_deployment_and_duration_sets_the_count(capsys):
    code, s = run(capsys, "--chip", "rtx-4090", "--engine", "llama.cpp", "--model",
                  "llama-3.1-8b", "--quant", "q4_0", "--rate", "4", "--duration", "5",
                  "--isl", "16", "--osl", "4", "--ignore-eos")
    assert code == 0 and s["requests"] == 20 and s["deployment"].endswith("/llama.cpp")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--chip", "m4-max-40", "--engine", "mlx", "--model", "llama-3.1-405b", "--quant",
          "bf16"], "does not fit the unified memory"),
        (["--chip", "h100-sxm", "--engine", "vllm"], "missing --model, --quant"),
        (["--deployment", "nope"], "unknown deployment 'nope'"),
        (["--duration", "5", "--rate", "inf"], "--duration needs a finite --rate"),
    ],
)
def test_errors_exit_2_with_a_reason(capsys, argv, words):
    code, out = run(capsys, *argv)
    assert code == 2 and words in out["error"]


def test_arrivals_default_to_poisson_at_the_rate_help_states(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Poisson stream at --rate (default 10 per second)" in text
    code, s = run(capsys, "--duration", "5", "--isl", "16", "--osl", "4", "--ignore-eos")
    assert code == 0 and s["requests"] == 50  # 10/s for 5 s: the default is a finite rate
    _, at_once = run(capsys, "--num-requests", "50", "--isl", "16", "--osl", "4",
                     "--ignore-eos", "--rate", "inf")
    # Poisson arrivals spread the same 50 requests over seconds; inf sends them at t=0
    assert s["duration_s"] > 3 * at_once["duration_s"]


def test_text_report(capsys):
    assert main(["simulate", "--num-requests", "5", "--isl", "16", "--osl", "4"]) == 0
    out = capsys.readouterr().out
    assert "deployment      vllm-h100" in out and "per million output tokens" in out
