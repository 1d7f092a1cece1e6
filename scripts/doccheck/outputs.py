"""Quoted outputs: what a block printed, normalised only where a run must differ, and the
docs rewritten with it.

Normalised in every mode: the ports the runner moved (back to the documented ones), pids,
trailing spaces and blank lines at the end. `output=wall` also blanks every number and collapses
runs of spaces (a real-time run's latencies and rates, and the column widths they set);
exact outputs — virtual time — must match to the digit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from scripts.doccheck.blocks import ShellBlock
from scripts.doccheck.commands import program, words
from scripts.doccheck.runner import Result

_MARKER = re.compile(r"\x1eDC(\d+)\n")  # the runner prints one before each command
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_PID = re.compile(r"\b(pid[ =:]?)\d+", re.IGNORECASE)


def per_command(output: str, n: int) -> list[str]:
    """The block's output split at the runner's markers: one string per command (a marker may
    follow output that did not end its line, e.g. curl's)."""
    parts = [""] * n
    pieces = _MARKER.split(output)
    if pieces[0].strip():  # the prelude's own complaint before any command
        parts[0] += pieces[0]
    for index, text in zip(pieces[1::2], pieces[2::2], strict=False):
        parts[int(index)] += text
    return parts


def actual_lines(result: Result) -> list[str]:
    """What the block printed, ports moved back, as the doc would quote it."""
    text = "".join(per_command(result.output, len(result.block.commands)))
    return _tidy(_unmove_ports(text, result).split("\n"))


def actual_console(result: Result) -> list[list[str]]:
    parts = per_command(result.output, len(result.block.commands))
    return [_tidy(_unmove_ports(p, result).split("\n")) for p in parts]


def _unmove_ports(text: str, result: Result) -> str:
    back = {base: hundred for hundred, base in result.moves.items()}

    def one(m: re.Match) -> str:
        port = int(m[0])
        hundred = back.get(port // 100 * 100)
        return m[0] if hundred is None else str(hundred + port % 100)

    return re.sub(r"(?<![\d.])\d{5}(?![\d.])", one, text)


def _tidy(lines: list[str]) -> list[str]:
    lines = [ln.rstrip() for ln in lines]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def normalise(lines: list[str], mode: str) -> list[str]:
    out = [_PID.sub(r"\1N", ln) for ln in _tidy(list(lines))]
    if mode == "wall":
        out = [re.sub(r" +", " ", _NUMBER.sub("N", ln)) for ln in out]
    return out


def mismatch(block: ShellBlock, result: Result) -> str | None:
    """None when the quoted output is what the block printed, else a unified diff."""
    quoted = block.quoted_output
    if quoted is None:
        return None
    want = normalise(quoted, block.output_mode)
    got = normalise(actual_lines(result), block.output_mode)
    if want == got:
        return None
    import difflib

    diff = difflib.unified_diff(want, got, f"{block.where} (quoted)", "printed now", lineterm="")
    return "\n".join(diff)


def rewrite(block: ShellBlock, result: Result) -> bool:
    """Write what the block printed into its doc; True when the doc changed."""
    f = block.output if block.output is not None else block.fence
    if block.output is not None:
        new_body = actual_lines(result)
    else:  # console: the prompts again, each followed by its output
        new_body = []
        for command, out in zip(block.commands, actual_console(result), strict=False):
            new_body += ["$ " + command.split("\n")[0], *command.split("\n")[1:], *out]
    path: Path = f.path
    lines = path.read_text().split("\n")
    old = lines[f.line:f.end_line - 1]
    new = [f.indent + ln if ln else ln for ln in new_body]
    if old == new:
        return False
    lines[f.line:f.end_line - 1] = new
    path.write_text("\n".join(lines))
    return True


def json_last_problems(block: ShellBlock, output: str) -> list[str]:
    """A documented `doppelchip ... --json` prints one JSON object as its last line, whatever
    it writes to stderr before it (read together here, as a terminal shows them): the
    commands of `block` that do not."""
    problems = []
    parts = per_command(output, len(block.commands))
    for command, out in zip(block.commands, parts, strict=True):
        ws = program(words(command))
        if ws[:1] != ["doppelchip"] or "--json" not in ws or "|" in ws or ">" in ws:
            continue
        lines = [ln for ln in out.split("\n") if ln.strip()]
        try:
            ok = bool(lines) and isinstance(json.loads(lines[-1]), dict)
        except ValueError:
            ok = False
        if not ok:
            problems.append(f"{block.where}: {command!r} ends with "
                            f"{(lines or [''])[-1][:200]!r}, not a JSON object")
    return problems
