"""Replay a JSONL trace: one request per line, sent at its recorded time.

Each line is a JSON object with
- `timestamp`: seconds (any origin; the first request is sent at 0, the rest keep their gaps);
- the prompt, one of `prompt_token_ids` (a list of ids), `prompt` (text, tokenized with the
  server's tokenizer) or `input_length` (that many seeded random ids);
- `max_tokens` (or `output_length`): how many tokens to generate;
- optional `ignore_eos` (default true, so the output length replays exactly) and `seed`;
- optional `slo_class`: the request's SLO class, a name such as "interactive" or "batch"
  (routed by `simulate --router slo-class`, reported per class; issue 16).
Lines are replayed in timestamp order; a malformed line is an error naming its line number.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from clients.conversation import FIRST_ORDINARY_ID, Conversation, Turn


def load_trace(
    path: str | Path,
    vocab_size: int,
    encode: Callable[[str], list[int]] | None = None,
    seed: int = 0,
    trace_format: str = "auto",
) -> list[Conversation]:
    """The conversations of the trace at `path`: this module's JSONL, or one of the public
    formats of clients/trace_formats.py (`trace_format`, or sniffed from the file)."""
    from clients.trace_formats import load_public, sniff  # --- trace formats (issue 16) ---

    fmt = sniff(path) if trace_format == "auto" else trace_format
    if fmt != "jsonl":
        return load_public(path, fmt, vocab_size, seed)
    rng = np.random.default_rng(seed)
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON: {e.msg}") from None
    if not rows:
        raise ValueError(f"{path}: the trace is empty")
    times = {n: _timestamp(row, f"{path}:{n}") for n, row in rows}
    rows.sort(key=lambda r: times[r[0]])
    t0 = times[rows[0][0]]
    out = []
    for i, (n, row) in enumerate(rows):
        where = f"{path}:{n}"
        max_tokens = row.get("max_tokens", row.get("output_length"))
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"{where}: max_tokens (or output_length) must be an integer >= 1")
        if "prompt_token_ids" in row:
            given = row["prompt_token_ids"]
            if not isinstance(given, list) or not all(_integer(t) and t >= 0 for t in given):
                raise ValueError(f"{where}: prompt_token_ids must be a list of token ids >= 0")
            ids = tuple(given)
        elif "prompt" in row:
            if encode is None:
                raise ValueError(f"{where}: a text prompt needs a tokenizer")
            ids = tuple(encode(str(row["prompt"])))
        elif "input_length" in row:
            length = row["input_length"]
            if not _integer(length) or length < 1:
                raise ValueError(f"{where}: input_length must be an integer >= 1")
            ids = tuple(int(x) for x in rng.integers(FIRST_ORDINARY_ID, vocab_size,
                                                      size=length))
        else:
            raise ValueError(f"{where}: needs prompt_token_ids, prompt or input_length")
        if not ids:
            raise ValueError(f"{where}: the prompt is empty")
        slo_class = row.get("slo_class", "")
        if not isinstance(slo_class, str):
            raise ValueError(f"{where}: slo_class must be a string (a class name)")
        seed = row.get("seed", i)
        if not _integer(seed) or seed < 0:
            raise ValueError(f"{where}: seed must be an integer >= 0")
        out.append(Conversation(
            f"t{i}", times[n] - t0, (Turn(ids, max_tokens),),
            ignore_eos=bool(row.get("ignore_eos", True)), seed=seed,
            slo_class=slo_class.strip(),
        ))
    return out


def _integer(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _timestamp(row: object, where: str) -> float:
    """A line's `timestamp` (0 when absent): a finite number of seconds."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a line must be a JSON object")
    t = row.get("timestamp", 0.0)
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
        raise ValueError(f"{where}: timestamp must be a finite number (seconds), got {t!r}")
    return float(t)
