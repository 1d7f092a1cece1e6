"""The `structured` workload in `doppelchip simulate`: jump-forward shows in the report."""

from __future__ import annotations

import json

from clients.structured import ORDER_SCHEMA_TEXT
from clients.workloads import WorkloadSpec, build_workload
from doppelchip.cli import main
from server.engine.options import EngineOptions
from sim.simulation import simulate_options

SGLANG = EngineOptions(name="sglang-h100", model="llama-3.1-8b", quant="bf16",
                       chip="h100-sxm", engine="sglang")
WORKLOAD = WorkloadSpec(kind="structured", num_requests=16, isl=64, osl=256, rate=40.0)


def test_structured_workload_carries_the_schema_and_honours_eos():
    convs = build_workload(WORKLOAD)
    assert len(convs) == 16
    assert all(c.constraint == ("json_schema", ORDER_SCHEMA_TEXT) for c in convs)
    assert not any(c.ignore_eos for c in convs)


def test_report_shows_jump_forward_and_its_saving():
    import dataclasses

    on = simulate_options(SGLANG, WORKLOAD)
    off = simulate_options(dataclasses.replace(SGLANG, jump_forward=False), WORKLOAD)
    assert on["requests"] == off["requests"] == 16 and not on["errors"]
    assert on["output_tokens"] == off["output_tokens"]  # the same JSON either way
    assert on["jump_forward_tokens"] > on["output_tokens"] // 2
    assert off["jump_forward_tokens"] == 0
    assert on["steps"] < off["steps"]
    assert on["e2e_s"]["mean"] < off["e2e_s"]["mean"]


def test_cli_structured_workload(capsys):
    argv = ["simulate", "--deployment", "sglang-h100", "--workload", "structured",
            "--num-requests", "8", "--osl", "256"]
    assert main([*argv, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["jump_forward_tokens"] > 0 and s["jump_forward"] is True
    assert main([*argv, "--jump-forward", "off", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["jump_forward_tokens"] == 0
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "jump-forward" in text and "forced by the grammar" in text
