"""Readers of the public LLM-serving traces (issue 16; docs/AUTOSCALING.md records the
columns followed and where they were read):

- **Azure LLM inference trace** (Azure/AzurePublicDataset, AzureLLMInferenceDataset2023.md
  and 2024): CSV `TIMESTAMP,ContextTokens,GeneratedTokens`; TIMESTAMP is a wall-clock time
  such as `2023-11-16 18:15:46.6805900` (up to 7 fractional digits).
- **BurstGPT** (HPMLL/BurstGPT, README "Schema"): CSV `Timestamp,Model,Request tokens,
  Response tokens,Total tokens,Log Type`; Timestamp in seconds from the first day's 0:00.
  Rows with 0 response tokens are failed requests in the original service: skipped.
- **Mooncake** (kvcache-ai/Mooncake, FAST25-release): JSONL with `timestamp` (milliseconds),
  `input_length`, `output_length` and `hash_ids`, the remapped hashes of the prompt's
  512-token blocks. Equal ids are equal blocks, so each id is mapped to one fixed run of 512
  seeded token ids and a prompt is its blocks in order, cut to `input_length`: rows sharing a
  prefix of ids share that prefix of tokens, and the prefix cache sees the sharing.

Every reader gives one-turn conversations whose first arrival is at 0 (the trace's gaps
kept), prompts of seeded random ids (the traces carry lengths, not text) and ignore_eos, so
output lengths replay exactly. A malformed row is an error naming its line.
"""

from __future__ import annotations

import csv
import json
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from clients.conversation import FIRST_ORDINARY_ID, Conversation, Turn

FORMATS = ("jsonl", "azure", "burstgpt", "mooncake")
MOONCAKE_BLOCK = 512  # tokens per hash id (Mooncake's trace; NVIDIA Dynamo's reader says so)
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


def sniff(path: str | Path) -> str:
    """The format of the file at `path` from its first line: a CSV header names Azure's or
    BurstGPT's columns; a JSON object with `hash_ids` is Mooncake; any other JSON line is this
    project's JSONL (clients/trace.py)."""
    with open(path) as f:
        first = next((line for line in f if line.strip()), "")
    head = first.strip()
    if head.startswith("{"):
        try:
            row = json.loads(head)
        except json.JSONDecodeError:
            return "jsonl"  # the JSONL reader reports the line
        return "mooncake" if isinstance(row, dict) and "hash_ids" in row else "jsonl"
    columns = [c.strip() for c in head.split(",")]
    if all(c in columns for c in AZURE_COLUMNS):
        return "azure"
    if all(c in columns for c in BURSTGPT_COLUMNS):
        return "burstgpt"
    raise ValueError(f"{path}: not a known trace format (a CSV header with "
                     f"{','.join(AZURE_COLUMNS)} or {', '.join(BURSTGPT_COLUMNS)}, or JSON "
                     "lines); pass --trace-format")


def load_public(path: str | Path, fmt: str, vocab_size: int, seed: int = 0,
                ) -> list[Conversation]:
    """The conversations of a public trace in format `fmt` (azure, burstgpt, mooncake)."""
    readers = {"azure": _azure, "burstgpt": _burstgpt, "mooncake": _mooncake}
    if fmt not in readers:
        raise ValueError(f"unknown trace format {fmt!r}; one of {', '.join(FORMATS)}")
    rows = readers[fmt](Path(path))  # (line, time s, input length, output length, blocks)
    if not rows:
        raise ValueError(f"{path}: the trace is empty")
    rows.sort(key=lambda r: (r[1], r[0]))
    rng = np.random.default_rng(seed)
    blocks: dict[int, tuple[int, ...]] = {}
    t0 = rows[0][1]
    out = []
    for i, (line, t, isl, osl, hashes) in enumerate(rows):
        if hashes is None:
            ids = tuple(int(x) for x in rng.integers(FIRST_ORDINARY_ID, vocab_size, size=isl))
        else:
            ids = _blocks(hashes, isl, vocab_size, seed, blocks, f"{path}:{line}")
        out.append(Conversation(f"t{i}", t - t0, (Turn(ids, osl),), ignore_eos=True, seed=i))
    return out


def _blocks(hashes: list[int], isl: int, vocab_size: int, seed: int,
            cache: dict[int, tuple[int, ...]], where: str) -> tuple[int, ...]:
    """The prompt of a Mooncake row: the blocks of its hash ids in order, cut to `isl`."""
    if len(hashes) * MOONCAKE_BLOCK < isl:
        raise ValueError(f"{where}: {len(hashes)} hash_ids cover {len(hashes) * MOONCAKE_BLOCK}"
                         f" tokens, fewer than input_length {isl}")
    ids: list[int] = []
    for h in hashes:
        if h not in cache:  # one fixed block per id, whatever row it first appears in
            g = np.random.default_rng([seed, h])
            cache[h] = tuple(int(x) for x in g.integers(FIRST_ORDINARY_ID, vocab_size,
                                                         size=MOONCAKE_BLOCK))
        ids += cache[h]
        if len(ids) >= isl:
            break
    return tuple(ids[:isl])


def _int(value: str | None, where: str, name: str, low: int) -> int:
    try:
        n = int(float(value or ""))
    except (ValueError, OverflowError):  # (not a number, NaN; infinite)
        raise ValueError(f"{where}: {name} must be an integer, got {value!r}") from None
    if n < low:
        raise ValueError(f"{where}: {name} must be >= {low}, got {n}")
    return n


def _csv(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f, skipinitialspace=True)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
        return [(n, row) for n, row in enumerate(reader, start=2)]


def _azure(path: Path) -> list:
    rows = []
    for n, row in _csv(path, AZURE_COLUMNS):
        where = f"{path}:{n}"
        rows.append((n, _azure_time(row["TIMESTAMP"], where),
                     _int(row["ContextTokens"], where, "ContextTokens", 1),
                     _int(row["GeneratedTokens"], where, "GeneratedTokens", 1), None))
    return rows


def _azure_time(text: str, where: str) -> float:
    """Seconds since the epoch of `2023-11-16 18:15:46.6805900` (fractions beyond the
    microsecond, which datetime cannot hold, are dropped)."""
    stamp, _, frac = text.strip().partition(".")
    try:
        when = datetime.fromisoformat(stamp)
        t = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    except ValueError:
        raise ValueError(f"{where}: TIMESTAMP {text!r} is not a date and time") from None
    if frac and not frac.isdigit():
        raise ValueError(f"{where}: TIMESTAMP {text!r} is not a date and time")
    return t + (float(f"0.{frac}") if frac else 0.0)


def _burstgpt(path: Path) -> list:
    rows = []
    for n, row in _csv(path, BURSTGPT_COLUMNS):
        where = f"{path}:{n}"
        try:
            t = float(row["Timestamp"])
            if not math.isfinite(t):
                raise ValueError
        except ValueError:
            raise ValueError(f"{where}: Timestamp must be seconds, got "
                             f"{row['Timestamp']!r}") from None
        out = _int(row["Response tokens"], where, "Response tokens", 0)
        if out == 0:
            continue  # a failed request (BurstGPT's README): nothing to replay
        rows.append((n, t, _int(row["Request tokens"], where, "Request tokens", 1), out, None))
    return rows


def _mooncake(path: Path) -> list:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON: {e.msg}") from None
        hashes = row.get("hash_ids")
        if not isinstance(hashes, list) or not all(isinstance(h, int) for h in hashes):
            raise ValueError(f"{where}: hash_ids must be a list of integers")
        try:
            t = float(row["timestamp"]) / 1000.0  # milliseconds
            if not math.isfinite(t):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where}: timestamp (milliseconds) is missing or not a "
                             "number") from None
        rows.append((n, t, _int(str(row.get("input_length", "")), where, "input_length", 1),
                     _int(str(row.get("output_length", "")), where, "output_length", 1),
                     hashes))
    return rows
