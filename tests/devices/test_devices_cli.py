"""`doppelchip devices` and `doppelchip estimate`, run in-process through argparse."""

from __future__ import annotations

import argparse
import json

import pytest

from doppelchip import cmd_devices


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="doppelchip")
    cmd_devices.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_devices_json(capsys: pytest.CaptureFixture[str]):
    assert run(["devices", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {c["id"] for c in data["chips"]} >= {"h100-sxm", "groq-lpu-v1", "nvme-gen4"}
    h100 = next(c for c in data["chips"] if c["id"] == "h100-sxm")
    assert h100["tiers"][0]["bandwidth_bytes_per_s"] == 3.35e12 and h100["source"]
    assert {e["id"] for e in data["engines"]} >= {"vllm", "groq"}
    assert data["models"] and data["quants"]
    # every fitted factor says where it came from
    apple = next(e for e in data["engines"] if e["id"] == "llama.cpp")["factors"]["apple"]
    prov = apple["provenance"]
    assert set(prov) == {"bw_eff", "flop_eff", "kernel_s"}
    assert prov["bw_eff"]["kind"] == "fitted" and prov["bw_eff"]["n_points"] == 3
    vllm = next(e for e in data["engines"] if e["id"] == "vllm")["factors"]
    assert vllm["nvidia-datacentre"]["provenance"]["flop_eff"] == {
        "kind": "borrowed", "points": ["trt-h100-128", "trt-h100-2048"], "n_points": 2,
        "from": "tensorrt-llm on nvidia-datacentre"}


def test_devices_table(capsys: pytest.CaptureFixture[str]):
    assert run(["devices"]) == 0
    out = capsys.readouterr().out
    assert "h100-sxm" in out and "3.35 TB/s" in out and "llama.cpp" in out


def test_estimate_json(capsys: pytest.CaptureFixture[str]):
    argv = ["estimate", "--chip", "m2-ultra-60", "--engine", "llama.cpp", "--model",
            "llama-2-7b", "--quant", "q4_0", "--prompt", "512", "--output", "128", "--json"]
    assert run(argv) == 0
    r = json.loads(capsys.readouterr().out)
    for key in ("fits", "chips", "prefill_tokens_per_s", "decode_tokens_per_s",
                "output_tokens_per_s", "ttft_s", "tpot_s", "bound", "memory_bytes",
                "joules_per_mtok", "usd_per_mtok"):
        assert key in r
    assert r["fits"] is True and r["chips"] == 1 and r["bound"] == "memory"
    assert r["decode_tokens_per_s"] == pytest.approx(88.6, rel=0.2)
    assert set(r["memory_bytes"]) == {"unified"}


def test_estimate_computes_groq_count(capsys: pytest.CaptureFixture[str]):
    argv = ["estimate", "--chip", "groq-lpu-v1", "--engine", "groq", "--model", "llama-2-70b",
            "--quant", "f16", "--prompt", "128", "--output", "64", "--json"]
    assert run(argv) == 0
    assert json.loads(capsys.readouterr().out)["chips"] > 500


def test_estimate_error_exit_2(capsys: pytest.CaptureFixture[str]):
    argv = ["estimate", "--chip", "m4-max-40", "--engine", "mlx", "--model", "llama-3.1-70b",
            "--quant", "f16", "--prompt", "512", "--output", "128", "--json"]
    assert run(argv) == 2
    r = json.loads(capsys.readouterr().out)
    assert r["fits"] is False and "unified memory" in r["error"]


def test_estimate_unknown_id_exit_2(capsys: pytest.CaptureFixture[str]):
    argv = ["estimate", "--chip", "h9000", "--engine", "vllm", "--model", "llama-3.1-8b",
            "--quant", "bf16"]
    assert run(argv) == 2
    assert "unknown chip" in capsys.readouterr().err
