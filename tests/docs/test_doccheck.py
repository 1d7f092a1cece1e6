"""The docs checker itself: it refuses docs that break the convention, fails a block whose
command breaks, and fails (then regenerates) a quoted output that changed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

import scripts.doccheck.runner as runner
from clients.client import AsyncClient
from scripts.doccheck.blocks import DocError, shell_blocks, split_commands
from scripts.doccheck.commands import move, script
from scripts.doccheck.outputs import json_last_problems, normalise
from scripts.doccheck.runner import allocate, release, run_block, talks_to_server
from scripts.doccheck.shared import GRPC, HTTP, SharedServer

ROOT = Path(__file__).resolve().parents[2]
FENCE = "```"
SIMULATE = ("doppelchip simulate --deployment vllm-h100 --num-requests 5 --rate 10 --seed 3 "
            "| grep -E '^(requests|throughput)'")


def doc(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "DOC.md"
    path.write_text(text.replace("'''", FENCE))
    return path


def test_an_unlabelled_fence_is_refused(tmp_path):
    with pytest.raises(DocError, match="without an info string"):
        shell_blocks(doc(tmp_path, "'''\ndoppelchip devices\n'''\n"))


def test_a_reason_outside_the_list_is_refused(tmp_path):
    with pytest.raises(DocError, match="not-run='slow' is not one of"):
        shell_blocks(doc(tmp_path, "'''bash not-run=slow\ndoppelchip whatif\n'''\n"))
    blocks = shell_blocks(doc(tmp_path, "'''bash not-run=kubernetes\nkubectl get pods\n'''\n"))
    assert [b.not_run for b in blocks] == ["kubernetes"]


def test_an_output_must_follow_a_shell_block(tmp_path):
    with pytest.raises(DocError, match="does not follow a shell block"):
        shell_blocks(doc(tmp_path, "'''toml\na = 1\n'''\n'''text output\n1\n'''\n"))


def test_commands_continue_over_backslashes_and_open_quotes():
    body = ["# a comment", "doppelchip serve \\", "  --port 1", "", "curl -d '{", "  \"a\": 1}'",
            "echo it's # not a quote"]
    assert split_commands(body[:-1]) == ["doppelchip serve \\\n  --port 1",
                                         "curl -d '{\n  \"a\": 1}'"]


def test_console_prompts_are_commands_and_the_rest_their_output(tmp_path):
    [block] = shell_blocks(doc(tmp_path, "'''console\n$ echo a \\\n  b\na b\n$ echo c\nc\n'''\n"))
    assert block.commands == ["echo a \\\n  b", "echo c"]
    assert block.quoted_output == ["a b", "c"]


def test_ports_are_moved_defaults_made_explicit_and_servers_probed():
    moves = {50000: 23400, 8000: 12300}
    body = script(["doppelchip serve --deployment vllm-h100 &  # a pod",
                   "curl -s localhost:8000/health", "doppelchip generate hi"], moves)
    assert ("__dc_server 0 http 12300/health 'doppelchip serve --port 23451 --http-port 12300 "
            "--deployment vllm-h100'") in body
    assert "curl -s localhost:12300/health" in body
    assert "doppelchip generate --target 127.0.0.1:23451 hi" in body
    # `make test` collects the suite instead of running it inside itself
    assert "PYTEST_ARGS='--collect-only -qq'" in script(["make test"], {})
    # vLLM's command line: --port is HTTP, gRPC has its own flag
    vllm = script(["doppelchip vllm serve meta-llama/Llama-3.1-8B-Instruct -tp 2 &"], moves)
    assert ("__dc_server 0 http 12300/health 'doppelchip vllm serve --port 12300 --grpc-port "
            "23451 meta-llama/Llama-3.1-8B-Instruct -tp 2'") in vllm
    # with -dpm the ranks' gRPC servers take free ports: no --grpc-port (vLLM refuses one)
    dpm = script(["doppelchip vllm serve Qwen/Qwen3-30B-A3B -dp 2 -dpl 2 -dpm &"], moves)
    assert ("__dc_server 0 http 12300/health 'doppelchip vllm serve --port 12300 "
            "Qwen/Qwen3-30B-A3B -dp 2 -dpl 2 -dpm'") in dpm
    # SGLang's: --port is HTTP (30000 by default), gRPC has doppelchip's own flag
    sglang = script(["doppelchip sglang serve --model-path meta-llama/Llama-3.1-8B-Instruct &"],
                    {**moves, 30000: 14500})
    assert ("__dc_server 0 http 14500/health 'doppelchip sglang serve --port 14500 --grpc-port "
            "23451 --model-path meta-llama/Llama-3.1-8B-Instruct'") in sglang
    # with --smg-grpc-mode --port is the scheduler service's; HTTP (probed) is on --port + 1
    grpc_mode = script(["doppelchip sglang serve --model-path m --smg-grpc-mode --port 30100 &"],
                       {**moves, 30100: 14600})
    assert "__dc_server 0 http 14601/health 'doppelchip sglang serve --model-path m " \
        "--smg-grpc-mode --port 14600'" in grpc_mode
    # TensorRT-LLM's: --port (8000) is HTTP, gRPC has doppelchip's own flag, as for vLLM's
    trtllm = script(["doppelchip trtllm-serve m &"], moves)
    assert "__dc_server 0 http 12300/health 'doppelchip trtllm-serve --port 12300 --grpc-port " \
        "23451 m'" in trtllm
    # with --grpc, --port is gRPC; doppelchip's HTTP (probed) on --port + 1
    trtllm = script(["doppelchip trtllm-serve m --grpc &"], moves)
    assert "__dc_server 0 http 12301/health 'doppelchip trtllm-serve --port 12300 --http-port " \
        "12301 m --grpc'" in trtllm


MANY = {h * 100 + 51 for h in range(300, 360)}  # 60 documented hundreds of ~227 to move to
OTHER_SUITE = ("from scripts.doccheck.runner import allocate; "
               f"print(sorted(allocate({sorted(MANY)!r}).values()))")


def test_two_suites_on_one_machine_never_move_to_the_same_hundred():
    # Each picks hundreds at random and checks nothing listens there yet; both could pick one
    # before either binds it (about 16 of 60 would collide), so each holds what it picked.
    ours = allocate(MANY)
    try:
        out = subprocess.run([sys.executable, "-c", OTHER_SUITE], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        theirs = set(json.loads(out))
        assert len(theirs) == len(MANY) and not theirs & set(ours.values())
    finally:
        release(ours)


def test_wall_outputs_ignore_numbers_and_nothing_else():
    a = ["[vllm-h100] 64 tokens, finish=length, TTFT 17.1 ms, 148.1 tokens/s"]
    b = ["[vllm-h100] 61 tokens, finish=length, TTFT  9.3 ms, 151.0 tokens/s"]
    c = ["[vllm-h100] 64 tokens, finish=stop, TTFT 17.1 ms, 148.1 tokens/s"]
    assert normalise(a, "wall") == normalise(b, "wall") != normalise(c, "wall")
    assert normalise(a, "exact") != normalise(b, "exact")


def test_a_broken_documented_command_fails_the_block(tmp_path):
    [ok, broken, missing] = shell_blocks(doc(tmp_path, (
        "'''bash\ndoppelchip estimate --chip h100-sxm --engine vllm --model llama-3.1-8b "
        "--quant bf16 --prompt 64 --output 8 | head -n 1\n'''\n"
        "'''bash\ndoppelchip simulate --deployment vllm-h100 --no-such-flag\n'''\n"
        "'''bash\ndoppelchip simulate --workload trace "
        "--trace examples/no-such-trace.jsonl\n'''\n")))
    assert run_block(ok, ROOT).ok
    for block in (broken, missing):
        result = run_block(block, ROOT)
        assert not result.ok, result.output


def test_a_block_past_its_time_is_ended_even_if_it_ignores_sigterm(tmp_path, monkeypatch):
    # SIGTERM first (the block's clean-up stops its servers), SIGKILL after the grace period:
    # waiting on its output without a bound hung the whole suite
    monkeypatch.setattr(runner, "STOP_GRACE_S", 1.0)
    [block] = shell_blocks(doc(tmp_path, (
        "'''bash\ntrap '' TERM; while true; do sleep 0.1 || true; done\n'''\n")))
    done: list[runner.Result] = []
    thread = threading.Thread(target=lambda: done.append(run_block(block, ROOT, timeout=1)),
                              daemon=True)
    thread.start()
    thread.join(60)
    assert done, "run_block still waits on a block that ignores SIGTERM"
    assert done[0].returncode == -1 and "took more than 1 s" in done[0].output


async def _finish(target: str, n: int) -> None:
    async def one(i: int) -> None:
        async for _ in client.generate(f"r{i}", max_tokens=1):
            pass

    async with AsyncClient(target) as client:
        for start in range(0, n, 50):
            await asyncio.gather(*(one(i) for i in range(start, min(n, start + 50))))


def test_the_shared_server_serves_on_past_a_pipes_worth_of_log():
    # A line per finished request: 700 are more than a pipe holds (64 KiB); had its log gone
    # to a pipe nobody reads until it stops, the server would block on a write and stall.
    server = SharedServer(ROOT)
    moves = server.ensure()
    try:
        asyncio.run(asyncio.wait_for(_finish(f"127.0.0.1:{move(GRPC, moves)}", 700), 120))
        url = f"http://127.0.0.1:{move(HTTP, moves)}/health"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200
    finally:
        rc = server.stop()
    assert rc == 0 and len(server.log.encode()) > 65536


def test_a_block_talking_to_a_server_it_does_not_start_is_told_apart(tmp_path):
    blocks = shell_blocks(doc(tmp_path, (
        "'''bash\ncurl -s localhost:8000/health\n'''\n"
        "'''bash\ndoppelchip serve &\ncurl -s localhost:8000/health\n'''\n")))
    assert [talks_to_server(b) for b in blocks] == [True, False]


def test_a_changed_output_fails_the_check_and_write_regenerates_it(tmp_path):
    path = doc(tmp_path, f"A run:\n\n'''bash\n{SIMULATE}\n'''\n\nprints\n\n'''text output\n"
                         "requests        5 ok, errors none (0.0%)\nthroughput      1 req/s\n"
                         "'''\n")

    def outputs(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(ROOT / "scripts" / "docs_outputs.py"),
                               *args, str(path)], capture_output=True, text=True, timeout=120)

    check = outputs("--check")
    assert check.returncode == 1 and "-throughput      1 req/s" in check.stderr, check.stderr
    assert outputs("--write").returncode == 0
    written = path.read_text()
    assert "throughput      1 req/s" not in written and "output tok/s" in written
    assert outputs("--check").returncode == 0
    # one digit of a virtual-time output changed: the check fails again
    line = next(ln for ln in written.split("\n") if ln.startswith("throughput"))
    digit = next(ch for ch in line if ch.isdigit())
    path.write_text(written.replace(line, line.replace(digit, str((int(digit) + 1) % 10), 1)))
    assert outputs("--check").returncode == 1


def test_a_json_command_whose_last_line_is_not_json_is_reported(tmp_path):
    [block] = shell_blocks(doc(tmp_path, "'''bash\ndoppelchip devices --json\n'''\n"))
    assert json_last_problems(block, "\x1eDC0\nwarning: slow\n{\"chips\": []}\n") == []
    [problem] = json_last_problems(block, "\x1eDC0\n{\"chips\": []}\nwarning: late\n")
    assert "not a JSON object" in problem
