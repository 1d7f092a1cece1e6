"""Every `--json` command prints one single-line JSON object as the last line of its output
(issue 16), whatever else it prints to stderr: scripts read `... --json | tail -1`."""

from __future__ import annotations

import json

import pytest

from doppelchip.cli import main

COMMANDS = [
    ["devices", "--json"],
    ["estimate", "--chip", "h100-sxm", "--model", "llama-3.1-8b", "--engine", "vllm",
     "--quant", "bf16", "--json"],
    ["simulate", "--num-requests", "4", "--isl", "32", "--osl", "8", "--json"],
    ["simulate", "--num-requests", "4", "--isl", "32", "--osl", "8", "--router", "p2c", "--json"],
    ["load", "--target", "sim:vllm-h100", "--num-requests", "4", "--isl", "32", "--osl", "8",
     "--json"],
    ["whatif", "--json"],
]


def last_line_object(out: str) -> dict:
    lines = out.rstrip("\n").split("\n")
    value = json.loads(lines[-1])
    assert isinstance(value, dict)
    return value


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_json_command_ends_with_one_json_line(argv, capsys):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert last_line_object(out)


def test_checker_rejects_pretty_printed_json():
    with pytest.raises(json.JSONDecodeError):
        last_line_object(json.dumps({"a": [1, 2]}, indent=2) + "\n")
