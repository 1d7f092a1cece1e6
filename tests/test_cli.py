"""The `doppelchip` command end to end: serve in a subprocess, generate, SIGTERM, help texts."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from clients.client import Client
from doppelchip.cli import build_parser
from doppelchip.v1 import inference_pb2 as pb

FLEET = """
[server]
time_scale = 0.05
drain_grace_s = 20.0
default_deployment = "fast"

[[deployments]]
name = "fast"
model = "llama-3.1-8b"
quant = "bf16"
chip = "h100-sxm"
engine = "vllm"
max_model_len = 1024

[[deployments]]
name = "slow"
model = "llama-3.1-70b"
quant = "q4_k_m"
chip = "rtx-4090"
engine = "llama.cpp"
"""

CLI = [sys.executable, "-m", "doppelchip.cli"]


@pytest.fixture
def served(tmp_path: Path):
    config = tmp_path / "fleet.toml"
    config.write_text(FLEET)
    proc = subprocess.Popen(
        [*CLI, "serve", "--config", str(config), "--port", "0", "--metrics-port", "0"],
        stderr=subprocess.PIPE, text=True,
    )
    port, seen = None, []
    for line in proc.stderr:  # the server prints its bound port once it serves
        seen.append(line)
        if m := re.search(r"listening on 127\.0\.0\.1:(\d+)", line):
            port = int(m.group(1))
            break
    assert port, "server did not start:\n" + "".join(seen)
    drained = threading.Thread(target=proc.stderr.read, daemon=True)  # keep the pipe empty
    drained.start()
    yield proc, port
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_generate_command_streams_and_summarises(served):
    _, port = served
    out = subprocess.run(
        [*CLI, "generate", "hello", "--target", f"127.0.0.1:{port}", "--max-tokens", "16",
         "--ignore-eos"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip()) > 0
    assert re.search(r"\[fast\] 16 tokens, finish=length, prompt \d+ tokens; emulated: TTFT "
                     r"[\d.]+ ms, [\d.]+ tokens/s, total [\d.]+ s; wall: TTFT [\d.]+ ms",
                     out.stderr)


def test_generate_command_reports_errors(served):
    _, port = served
    out = subprocess.run(
        [*CLI, "generate", "hello", "--target", f"127.0.0.1:{port}", "--deployment", "nope"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 1
    assert "error: NOT_FOUND: unknown deployment 'nope'" in out.stderr


def test_sigterm_drains_in_flight_stream_and_exits_zero(served):
    proc, port = served
    with Client(f"127.0.0.1:{port}") as client:
        stream = client.generate("drain me", deployment="slow", max_tokens=30, ignore_eos=True)
        first = next(stream)
        assert first.token_ids
        proc.send_signal(signal.SIGTERM)
        rest = list(stream)
    assert rest[-1].final.finish_reason == pb.FINISH_REASON_LENGTH
    assert len(first.token_ids) + sum(len(c.token_ids) for c in rest) == 30
    assert proc.wait(30) == 0


def test_bad_config_is_a_clear_error(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text(FLEET.replace("time_scale = 0.05", "time_scael = 0.05"))
    out = subprocess.run([*CLI, "serve", "--config", str(bad)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert "unknown key(s) time_scael" in out.stderr


def test_every_subcommand_option_has_help():
    parser = build_parser()
    sub = next(a for a in parser._subparsers._actions if a.choices)
    assert {"serve", "generate", "devices", "estimate", "simulate"} <= set(sub.choices)
    for command, subparser in sub.choices.items():
        for action in subparser._actions:
            if action.dest != "help":
                assert action.help, f"{command} {action.option_strings or action.dest}: no help"
