"""`doppelchip generate` as a user runs it: a prompt from a file or stdin (140k words), the
summary with every figure labelled emulated or wall, errors on their own stderr line with
the status name, Ctrl-C in a real pseudo-terminal (cancelled on the server, summary, 130),
and one exit-status table in every command's --help."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from fleets import TEST_FLEET, fleet_doc
from server_proc import ServerProcess, free_run, metric

from clients.generate import Progress, summary_line
from doppelchip.cli import build_parser
from doppelchip.v1 import inference_pb2 as pb
from server.engine.tokenizer import get_tokenizer

CLI = [sys.executable, "-m", "doppelchip.cli"]

FAST, SLOW = TEST_FLEET["deployments"]
FLEET = fleet_doc(deployments=[
    FAST,
    # ~0.3 emulated s per token (15 ms of wall time): streams long enough to interrupt (no
    # 2-deep waiting queue here: nothing is refused for admission)
    {k: v for k, v in SLOW.items() if k != "max_waiting"},
    # Llama 4 Scout's context (10M) holds a 140k-word prompt; FP8 on two H100s
    {"name": "long", "model": "llama-4-scout", "quant": "fp8", "chip": "h100-sxm",
     "engine": "vllm", "count": 2, "max_model_len": 200_000},
])

RATE = r"(?:[\d.]+|n/a) tokens/s"  # n/a: every token came in one chunk (nothing to time)
SUMMARY = (r"(?m)^\[(?P<dep>[\w-]+)\] (?P<n>\d+) tokens, finish=(?P<finish>\w+), "
           r"prompt (?P<prompt>\d+) tokens(?: \(\d+ cached\))?; "
           rf"emulated: TTFT [\d.]+ ms, {RATE}, total [\d.]+ s; "
           rf"wall: TTFT [\d.]+ ms, {RATE}, total [\d.]+ s$")


@pytest.fixture(scope="module")
def server():
    with ServerProcess(FLEET) as s:
        yield s


def generate(server: ServerProcess, *argv: str, stdin: str | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "generate", "--target", server.target, *argv],
                          capture_output=True, text=True, input=stdin, timeout=timeout)


def test_summary_labels_every_figure_emulated_or_wall():
    """The emulated figures come from the server's token times, the wall ones from the
    client's clock: a 20x time scale shows as 20x apart."""
    progress = Progress(start=100.0, tokens=11, first=100.002, last=100.052,
                        emulated_first=0.04, emulated_last=1.04)
    final = pb.Final(finish_reason=pb.FINISH_REASON_LENGTH, deployment="d",
                     usage=pb.Usage(prompt_tokens=7, completion_tokens=11),
                     timings=pb.Timings(e2e_s=1.04))
    line = summary_line(final, progress, end=100.06)
    assert line == ("[d] 11 tokens, finish=length, prompt 7 tokens; "
                    "emulated: TTFT 40.0 ms, 10.0 tokens/s, total 1.04 s; "
                    "wall: TTFT 2.0 ms, 200.0 tokens/s, total 0.06 s")
    partial = summary_line(None, Progress(start=0.0), end=0.5)  # interrupted before a token
    assert partial == ("0 tokens; emulated: TTFT n/a, n/a tokens/s, total 0.00 s; "
                       "wall: TTFT n/a, n/a tokens/s, total 0.50 s")


def test_generate_summary_end_to_end(server):
    out = generate(server, "hello", "--max-tokens", "16", "--ignore-eos")
    assert out.returncode == 0, out.stderr
    m = re.search(SUMMARY, out.stderr)
    assert m, out.stderr
    assert (m["dep"], m["n"], m["finish"]) == ("fast", "16", "length")
    assert out.stdout.endswith("\n") and out.stdout.strip()


def test_prompt_file_of_140k_words_and_from_stdin(server, tmp_path: Path):
    vocabulary = ["the", "of", "and", "to", "in", "is", "it", "that", "was", "for", "on", "are"]
    words = " ".join(vocabulary[i % len(vocabulary)] for i in range(140_000))
    path = tmp_path / "long.txt"
    path.write_text(words)
    assert len(words.encode()) > 131072  # more than one argv string may hold (MAX_ARG_STRLEN)
    expected = len(get_tokenizer().encode(words))
    assert expected < FLEET["deployments"][2]["max_model_len"]
    out = generate(server, "--prompt-file", str(path), "--deployment", "long",
                   "--max-tokens", "2", "--ignore-eos")
    assert out.returncode == 0, out.stderr
    m = re.search(SUMMARY, out.stderr)
    assert m, out.stderr
    assert int(m["prompt"]) == expected  # the whole file reached the server
    short = "tell me about pipes"
    out = generate(server, "--prompt-file", "-", "--max-tokens", "2", "--ignore-eos",
                   stdin=short)
    assert out.returncode == 0, out.stderr
    m = re.search(SUMMARY, out.stderr)
    assert m, out.stderr
    assert int(m["prompt"]) == len(get_tokenizer().encode(short))


@pytest.mark.parametrize("argv", [
    ["generate"],  # no prompt at all
    ["generate", "hi", "--prompt-file", "x.txt"],  # both
])
def test_prompt_and_prompt_file_are_one_or_the_other(argv, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    assert "prompt" in capsys.readouterr().err


def test_unreadable_prompt_file_is_a_usage_error(server, tmp_path: Path):
    out = generate(server, "--prompt-file", str(tmp_path / "missing.txt"))
    assert out.returncode == 2
    assert f"error: cannot read {tmp_path / 'missing.txt'}: No such file" in out.stderr


def test_timeout_error_on_its_own_line_after_the_partial_text(server):
    out = generate(server, "count slowly", "--deployment", "slow", "--max-tokens", "2000",
                   "--ignore-eos", "--timeout", "1")
    assert out.returncode == 1
    assert re.search(r"(?m)^error: DEADLINE_EXCEEDED: ", out.stderr), out.stderr
    assert out.stdout == "" or out.stdout.endswith("\n")  # the text's line is ended
    assert "Traceback" not in out.stderr


def test_unreachable_server_exits_1_with_the_status_name():
    out = subprocess.run([*CLI, "generate", "hi", "--target", f"127.0.0.1:{free_run(1)}",
                          "--timeout", "3"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert re.search(r"(?m)^error: (UNAVAILABLE|DEADLINE_EXCEEDED): ", out.stderr), out.stderr


def test_every_command_documents_the_exit_codes():
    parser = build_parser()
    sub = next(a for a in parser._subparsers._actions if a.choices)
    for command, subparser in sub.choices.items():
        text = subparser.format_help()
        for code in ("0 ", "1 ", "2 ", "130 "):
            assert re.search(rf"(?m)^  {code}", text), f"{command}: no exit status {code}"
    assert "\n  130  interrupted (Ctrl-C)" in sub.choices["generate"].format_help()


# ---- Ctrl-C in a pseudo-terminal ---------------------------------------------------------


def read_until(fd: int, pattern: str, deadline: float, seen: bytearray) -> bool:
    """Read the terminal's output into `seen` until it matches `pattern` (True) or the child
    closed the terminal (False)."""
    regex = re.compile(pattern.encode())
    while not regex.search(seen):
        left = deadline - time.monotonic()
        assert left > 0, f"no {pattern!r} on the terminal: {bytes(seen)!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            data = os.read(fd, 4096)
        except OSError as e:  # EIO: every process holding the terminal has gone
            if e.errno != errno.EIO:
                raise
            return False
        if not data:
            return False
        seen += data
    return True


def test_ctrl_c_in_a_terminal_cancels_on_the_server_and_prints_the_summary(server):
    aborted = metric(server.scrape(), "vllm:request_success_total", deployment="slow",
                     finished_reason="abort")
    master, slave = os.openpty()

    def controlling_terminal() -> None:  # the child's own session, the pty its terminal
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        [*CLI, "generate", "interrupt me", "--target", server.target, "--deployment", "slow",
         "--max-tokens", "2000", "--ignore-eos"],
        stdin=slave, stdout=slave, stderr=slave, preexec_fn=controlling_terminal,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    os.close(slave)
    seen = bytearray()
    try:
        deadline = time.monotonic() + 60
        # mid-stream: the first generated words are on the terminal
        assert read_until(master, r"\w+ \w+", deadline, seen), bytes(seen)
        os.write(master, b"\x03")  # Ctrl-C: the terminal sends SIGINT to the foreground group
        read_until(master, r"(?!)", deadline, seen)  # everything, until the child closes it
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = seen.decode(errors="replace").replace("\r\n", "\n")
    assert code == 130, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    m = re.search(r"(?m)^interrupted: request cancelled; (\d+) tokens; emulated: TTFT [\d.]+ "
                  rf"ms, {RATE}, total [\d.]+ s; wall: TTFT [\d.]+ ms, {RATE}, total [\d.]+ s$",
                  text)
    assert m, text
    assert 0 < int(m[1]) < 2000
    # the server aborted the request (and freed it: nothing left running on `slow`)
    deadline = time.monotonic() + 20
    while metric(server.scrape(), "vllm:request_success_total", deployment="slow",
                 finished_reason="abort") != aborted + 1:
        assert time.monotonic() < deadline, "the server did not abort the request"
        time.sleep(0.05)
    assert metric(server.scrape(), "vllm:num_requests_running", deployment="slow") == 0


def test_only_one_flag_reads_stdin():
    out = subprocess.run([*CLI, "generate", "--prompt-file", "-", "--json-schema", "-"],
                         capture_output=True, text=True, input="{}", timeout=60)
    assert out.returncode == 2
    assert "only one of --prompt-file, --json-schema and --grammar can read" in out.stderr


def test_after_ctrl_c_a_grpc_threads_exception_does_not_cut_into_the_summary():
    import signal
    import threading

    from clients.generate import _quiet_after_interrupt

    def raise_in_a_thread() -> None:
        def boom() -> None:
            raise RuntimeError("channel closed under me")
        t = threading.Thread(target=boom, name="spin")
        t.start()
        t.join()

    reported: list[str] = []
    hook = threading.excepthook
    threading.excepthook = lambda args: reported.append(args.thread.name)
    # the handler before: Python's default, or SIG_IGN inherited when the suite was started
    # in the background of a non-interactive shell (which ignores SIGINT for such jobs)
    before = signal.getsignal(signal.SIGINT)
    try:
        with _quiet_after_interrupt():
            raise_in_a_thread()  # before the interrupt: reported as ever
        assert reported == ["spin"]
        with pytest.raises(KeyboardInterrupt), _quiet_after_interrupt():
            signal.raise_signal(signal.SIGINT)
        raise_in_a_thread()  # the cancelled call's threads, after it: dropped
        assert reported == ["spin"]
        assert signal.getsignal(signal.SIGINT) is before  # restored
    finally:
        threading.excepthook = hook
