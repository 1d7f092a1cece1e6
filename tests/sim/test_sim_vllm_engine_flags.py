"""vLLM's `--enforce-eager` and `--gpu-memory-utilization` on `simulate` (the flags `serve`'s pod
mode and `vllm serve` share): the virtual-time run prices the eager launches and sizes the KV
pool from the memory share, as the device layer does (tests/devices/test_devices_checkpoints)."""

from __future__ import annotations

import json

import pytest

from doppelchip.cli import main

SMALL_STEPS = ["simulate", "--chip", "b200", "--engine", "vllm", "--model", "qwen3-30b-a3b",
               "--quant", "fp8", "--num-requests", "1", "--rate", "inf", "--isl", "64",
               "--osl", "32", "--ignore-eos", "--json"]


def summary(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_enforce_eager_makes_launch_bound_decode_steps_wait_for_the_host(capsys):
    graph = summary(capsys, SMALL_STEPS)["tpot_s"]["p50"]
    eager = summary(capsys, [*SMALL_STEPS, "--enforce-eager"])["tpot_s"]["p50"]
    # 10 kernels per layer x 48 layers x 5 us of host launch each: 2.4 ms a step
    assert eager == pytest.approx(10 * 48 * 5e-6) and eager > graph * 1.05


def test_a_smaller_memory_share_leaves_a_smaller_kv_pool(capsys):
    argv = ["simulate", "--deployment", "vllm-h100", "--num-requests", "1", "--json"]
    full = summary(capsys, argv)
    half = summary(capsys, [*argv, "--gpu-memory-utilization", "0.5"])
    assert half["output_tokens"] == full["output_tokens"]  # the same request and tokens
    assert half["kv_usage_peak"] > 2 * full["kv_usage_peak"]  # in a pool under half the size
    assert main([*argv, "--gpu-memory-utilization", "0"]) == 2
    assert "--gpu-memory-utilization must be in (0, 1]" in capsys.readouterr().err
