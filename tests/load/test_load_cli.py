"""`doppelchip load`: sim: is the simulate path; goodput; outputs; clear errors."""

from __future__ import annotations

import csv
import json

import pytest

from clients.report import RequestResult, goodput, parse_slo
from doppelchip.cli import main

ARGS = ["--num-requests", "20", "--isl", "64", "--osl", "16", "--ignore-eos", "--rate", "10"]


def test_sim_target_is_the_simulate_path(capsys, tmp_path):
    assert main(["simulate", *ARGS, "--json"]) == 0
    simulated = json.loads(capsys.readouterr().out)
    out_json, out_csv = tmp_path / "load.json", tmp_path / "load.csv"
    assert main(["load", "--target", "sim:vllm-h100", *ARGS, "--json", "--slo",
                 "ttft=1,tpot=1", "--output-json", str(out_json),
                 "--output-csv", str(out_csv)]) == 0
    loaded = json.loads(capsys.readouterr().out)
    for key in ("requests", "output_tokens_per_s", "ttft_s", "e2e_s", "usd_per_mtok"):
        assert loaded[key] == simulated[key]
    assert loaded["goodput"]["fraction"] == 1.0
    records = json.loads(out_json.read_text())["requests"]
    assert len(records) == 20 and len(records[0]["token_times"]) == 16
    rows = list(csv.DictReader(out_csv.open()))
    assert len(rows) == 20 and float(rows[0]["e2e_s"]) > 0


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--target", "10.0.0.7:50051"], "only target loopback"),
        (["--target", "sim:nope"], "unknown deployment 'nope'"),
        (["--target", "sim:", "--slo", "ttft"], "bad SLO term 'ttft'"),
        (["--target", "sim:", "--concurrency", "0"], "--concurrency must be >= 1"),
    ],
)
def test_errors_exit_2(capsys, argv, words):
    assert main(["load", *argv, "--num-requests", "2", "--json"]) == 2
    assert words in json.loads(capsys.readouterr().err)["error"]


def test_unreachable_server_exits_1(capsys):  # a failure with a status, not bad input
    assert main(["load", "--target", "127.0.0.1:1", "--num-requests", "2", "--json"]) == 1
    assert "cannot reach 127.0.0.1:1: UNAVAILABLE" in json.loads(capsys.readouterr().err)["error"]


def test_goodput_by_hand():
    rows = [
        RequestResult("a", 0.0, 0.0, (0.2, 0.3, 0.4), 0.4, 10, 3),  # ttft .2 tpot .1
        RequestResult("b", 1.0, 1.0, (1.6, 1.7), 1.7, 10, 2),  # ttft .6 tpot .1
        RequestResult("c", 2.0, 2.0, (2.1, 2.5), 3.0, 10, 2),  # ttft .1 tpot .4
        RequestResult("d", 2.0, 2.0, (), 2.0, 10, 0, error="UNAVAILABLE"),
    ]
    slo = parse_slo("ttft=0.5, tpot=0.2")
    assert slo == {"ttft": 0.5, "tpot": 0.2}
    g = goodput(rows, slo)
    assert g["fraction"] == 0.25 and g["requests_per_s"] == pytest.approx(1 / 3.0)
    assert goodput(rows, {"e2e": 1.0})["fraction"] == 0.75


def test_sim_closed_loop_never_exceeds_its_concurrency(capsys, tmp_path):
    out = tmp_path / "closed.json"
    assert main(["load", "--target", "sim:", "--concurrency", "3", "--num-requests", "30",
                 "--isl", "32", "--osl", "8", "--ignore-eos", "--output-json", str(out)]) == 0
    capsys.readouterr()
    records = json.loads(out.read_text())["requests"]
    events = sorted([(r["scheduled_s"], 1) for r in records] + [(r["end_s"], -1)
                                                                  for r in records])
    in_flight = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts at a tie
        in_flight += delta
        peak = max(peak, in_flight)
    assert peak == 3 and len(records) == 30
