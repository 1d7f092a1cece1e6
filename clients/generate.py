"""`doppelchip generate`: stream one request's text to the terminal, then a summary line."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import grpc

from clients.client import Client
from doppelchip.v1 import inference_pb2 as pb


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
    start = time.perf_counter()
    first: float | None = None
    tokens = 0
    final: pb.Final | None = None
    try:
        with Client(target, **(security or {})) as client:
            for chunk in client.generate(prompt, timeout=timeout, **kwargs):
                if chunk.token_ids and first is None:
                    first = time.perf_counter()
                tokens += len(chunk.token_ids)
                out.write(chunk.text)
                out.flush()
                if chunk.HasField("final"):
                    final = chunk.final
    except grpc.RpcError as e:
        out.write("\n")
        err.write(f"error: {e.code().name}: {e.details()}\n")
        return 1
    end = time.perf_counter()
    out.write("\n")
    err.write(summary_line(final, tokens, start, first, end) + "\n")
    return 0


def read_constraint(
    *, json_schema: str | None = None, regex: str | None = None,
    choice: list[str] | None = None, grammar: str | None = None,
) -> dict[str, Any]:
    """`build_request` keyword arguments for the CLI's constraint flags; `json_schema` and
    `grammar` name files ("-": standard input). Raises OSError if a file cannot be read."""
    def read(path: str) -> str:
        return sys.stdin.read() if path == "-" else Path(path).read_text()

    if json_schema is not None:
        return {"json_schema": read(json_schema)}
    if grammar is not None:
        return {"grammar": read(grammar)}
    if regex is not None:
        return {"regex": regex}
    if choice:
        return {"choice": list(choice)}
    return {}


def summary_line(
    final: pb.Final | None, tokens: int, start: float, first: float | None, end: float
) -> str:
    """One line: tokens, finish reason, TTFT and decode rate as the client measured them."""
    reason = pb.FinishReason.Name(final.finish_reason).removeprefix("FINISH_REASON_").lower() \
        if final else "unknown"
    ttft = f"{(first - start) * 1e3:.1f} ms" if first is not None else "n/a"
    rate = (tokens - 1) / (end - first) if first is not None and tokens > 1 and end > first else 0
    where = f"[{final.deployment}] " if final and final.deployment else ""
    jumped = final.usage.jump_forward_tokens if final else 0
    forced = f" ({jumped} jump-forward)" if jumped else ""
    return (
        f"{where}{tokens} tokens{forced}, finish={reason}, TTFT {ttft}, {rate:.1f} tokens/s, "
        f"total {(end - start):.2f} s"
    )
