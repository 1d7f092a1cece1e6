"""`doppelchip COMMAND ...` builds only COMMAND's parser (start-up: a simulate run does not
import the gateway's urllib or the load generator), and that parser reads its arguments
exactly as the whole command line does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from doppelchip.cli import _COMMANDS, build_parser

ROOT = Path(__file__).resolve().parent.parent

ARGV = [
    ["simulate", "--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-2-7b",
     "--quant", "bf16", "--num-requests", "3", "--rate", "inf", "--json"],
    ["estimate", "--chip", "h100-sxm", "--engine", "vllm", "--model", "llama-2-7b",
     "--quant", "bf16"],
    ["devices", "--json"],
    ["gateway", "--replicas", "3"],
    ["generate", "hello", "--max-tokens", "4"],
    ["load", "--target", "127.0.0.1:1", "--num-requests", "2"],
    ["status"],
    ["serve", "--port", "50999"],
    ["plan", "--model", "llama-2-7b", "--slo", "ttft_p99<1"],
    ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "-tp", "2", "--trust-remote-code"],
    ["sglang", "serve", "--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--tp", "2",
     "--trust-remote-code"],
    ["trtllm-serve", "meta-llama/Llama-3.1-8B-Instruct", "--grpc", "--tp_size", "2",
     "--trust_remote_code"],
]


@pytest.mark.parametrize("argv", ARGV, ids=lambda a: a[0])
def test_one_command_parser_parses_alike(argv: list[str]):
    whole = vars(build_parser().parse_args(argv))
    one = vars(build_parser(argv[0]).parse_args(argv))
    assert one == whole


def test_every_command_has_its_module():
    sub = next(a for a in build_parser()._subparsers._actions if a.choices)
    assert set(sub.choices) == {*_COMMANDS, "generate"}
    for command in sub.choices:
        only = next(a for a in build_parser(command)._subparsers._actions if a.choices)
        assert command in only.choices


def test_simulate_imports_only_its_command_module():
    code = ("import sys; from doppelchip.cli import build_parser; build_parser('simulate'); "
            "print(sorted(m for m in sys.modules if m.startswith('doppelchip.cmd_')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out.strip() == "['doppelchip.cmd_simulate']"
    assert "urllib.request" not in subprocess.run(
        [sys.executable, "-c", code.replace("m.startswith('doppelchip.cmd_')", "True")],
        capture_output=True, text=True, check=True, cwd=ROOT).stdout


def test_top_level_help_still_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "doppelchip.cli", "--help"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    for command in (*_COMMANDS, "generate"):
        assert command in out
