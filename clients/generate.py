"""`doppelchip generate`: stream one request's text to the terminal, then a summary line.

Contract (the CLI's; docs in `doppelchip generate --help`):
- the text goes to `out` as it arrives; everything else goes to `err`, each message on its own
  line (a newline is written to `out` first when the text printed so far does not end in one);
- the summary states every figure twice, labelled: on the server's **emulated** timeline
  (from the token times the server sends, so it holds under `--time-scale` and when the
  request is interrupted) and in **wall** time as this client measured it;
- exit codes follow `doppelchip.exit_codes`: 0 done, 1 an error status (printed as
  `error: STATUS_NAME: details`), 130 interrupted — Ctrl-C cancels the call, so the server
  aborts the request and frees its KV blocks, and the partial summary is printed.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import grpc

from clients.client import Client
from doppelchip.v1 import inference_pb2 as pb

OK, FAILED, INTERRUPTED = 0, 1, 130  # doppelchip.exit_codes (clients/ does not import it)


@dataclass
class Progress:
    """What the client saw of one stream so far: token count, wall times (perf_counter) of the
    start, first and last token, the emulated times of the first and last token (seconds since
    the request arrived, from `token_times`), and whether the printed text ends a line."""

    start: float
    tokens: int = 0
    first: float | None = None
    last: float | None = None
    emulated_first: float | None = None
    emulated_last: float | None = None
    at_line_start: bool = True

    def add(self, chunk: pb.GenerateResponse, now: float) -> None:
        if chunk.token_ids:
            self.tokens += len(chunk.token_ids)
            self.first = now if self.first is None else self.first
            self.last = now
        if chunk.token_times:
            if self.emulated_first is None:
                self.emulated_first = chunk.token_times[0]
            self.emulated_last = chunk.token_times[-1]
        if chunk.text:
            self.at_line_start = chunk.text.endswith("\n")


def run_generate(
    target: str,
    prompt: str,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    timeout: float | None = None,
    security: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> int:
    """Stream text to `out`; the summary (or the error) goes to `err`. Returns the exit code.
    `security`: `Client`'s TLS and API-key arguments. `out`/`err` default to the streams
    `sys` has when called (not when imported)."""
    out, err = out or sys.stdout, err or sys.stderr
    progress = Progress(start=time.perf_counter())
    final: pb.Final | None = None
    try:
        with _quiet_after_interrupt(), Client(target, **(security or {})) as client:
            stream = client.generate(prompt, timeout=timeout, return_token_times=True, **kwargs)
            with contextlib.closing(stream):  # closing cancels the call (Client.generate)
                for chunk in stream:
                    progress.add(chunk, time.perf_counter())
                    out.write(chunk.text)
                    out.flush()
                    if chunk.HasField("final"):
                        final = chunk.final
    except KeyboardInterrupt:
        _end_line(out, progress)
        err.write(f"interrupted: request cancelled; "
                  f"{summary_line(None, progress, time.perf_counter())}\n")
        return INTERRUPTED
    except grpc.RpcError as e:
        _end_line(out, progress)
        err.write(f"error: {e.code().name}: {e.details()}\n")
        return FAILED
    _end_line(out, progress)
    err.write(summary_line(final, progress, time.perf_counter()) + "\n")
    return OK


@contextlib.contextmanager
def _quiet_after_interrupt() -> Iterator[None]:
    """Ctrl-C cancels the call and closes the channel while gRPC's own threads may still be
    reading it; an exception one of them raises then would print "Exception in thread …" in
    the middle of the summary (seen once in a loaded test run). From the SIGINT on, such
    exceptions are dropped: the call is cancelled on purpose. The main thread still gets its
    KeyboardInterrupt. The previous SIGINT handler is restored on the way out, and the previous
    hook too unless interrupted (the closed channel's threads may outlive the block while the
    summary is written; the command then exits). Off the main thread, where signal handlers
    cannot be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupted = threading.Event()
    hook = threading.excepthook

    def on_sigint(signum: int, frame: object) -> None:
        interrupted.set()
        raise KeyboardInterrupt

    def quiet(args: threading.ExceptHookArgs) -> None:
        if not interrupted.is_set():
            hook(args)

    previous = signal.signal(signal.SIGINT, on_sigint)
    threading.excepthook = quiet
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if not interrupted.is_set():
            threading.excepthook = hook


def _end_line(out: TextIO, progress: Progress) -> None:
    """End the streamed text's line, so what follows on stderr starts a line of its own."""
    if not progress.at_line_start:
        out.write("\n")
    out.flush()


def read_text(path: str) -> str:
    """A file's text, or standard input's for "-". Raises OSError if it cannot be read."""
    return sys.stdin.read() if path == "-" else Path(path).read_text()


def read_constraint(
    *, json_schema: str | None = None, regex: str | None = None,
    choice: list[str] | None = None, grammar: str | None = None,
) -> dict[str, Any]:
    """`build_request` keyword arguments for the CLI's constraint flags; `json_schema` and
    `grammar` name files ("-": standard input). Raises OSError if a file cannot be read."""
    if json_schema is not None:
        return {"json_schema": read_text(json_schema)}
    if grammar is not None:
        return {"grammar": read_text(grammar)}
    if regex is not None:
        return {"regex": regex}
    if choice:
        return {"choice": list(choice)}
    return {}


def _rates(ttft: float | None, first: float | None, last: float | None, tokens: int,
           total: float) -> str:
    """"TTFT x ms, y tokens/s, total z s" on one clock; n/a where there is nothing to time."""
    ttft_s = f"{ttft * 1e3:.1f} ms" if ttft is not None else "n/a"
    span = (last - first) if first is not None and last is not None else 0.0
    rate = f"{(tokens - 1) / span:.1f}" if tokens > 1 and span > 0 else "n/a"
    return f"TTFT {ttft_s}, {rate} tokens/s, total {total:.2f} s"


def summary_line(final: pb.Final | None, progress: Progress, end: float) -> str:
    """One line: deployment, tokens, finish reason, prompt tokens, then TTFT, decode rate
    (tokens after the first over the time from the first to the last token) and total time,
    labelled
    `emulated:` (the server's timeline) and `wall:` (this client's clock)."""
    p = progress
    where = f"[{final.deployment}] " if final and final.deployment else ""
    jumped = final.usage.jump_forward_tokens if final else 0
    forced = f" ({jumped} jump-forward)" if jumped else ""
    head = f"{where}{p.tokens} tokens{forced}"
    if final is not None:
        reason = pb.FinishReason.Name(final.finish_reason).removeprefix("FINISH_REASON_")
        cached = final.usage.cached_prompt_tokens
        head += (f", finish={reason.lower()}, prompt {final.usage.prompt_tokens} tokens"
                 + (f" ({cached} cached)" if cached else ""))
    emulated_total = final.timings.e2e_s if final is not None else (p.emulated_last or 0.0)
    emulated = _rates(p.emulated_first, p.emulated_first, p.emulated_last, p.tokens,
                      emulated_total)
    wall = _rates(None if p.first is None else p.first - p.start, p.first, p.last, p.tokens,
                  end - p.start)
    return f"{head}; emulated: {emulated}; wall: {wall}"
