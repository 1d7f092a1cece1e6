"""Fenced blocks of the Markdown docs and what the docs convention makes of them.

A `ShellBlock` is one ```` ```bash ```` (`sh`, `shell`, `console`) fence: its commands, its
`not-run=REASON` marker, and the output quoted after it (a ```` ```text output ```` fence that
is the next fence, prose between; or the non-prompt lines of a `console` fence). It is the unit
the runner executes and the outputs script regenerates, so it keeps the source lines needed to
rewrite the quoted output in place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

SHELL_LANGS = frozenset({"bash", "sh", "shell", "console"})
# Why a documented command may be left unrun: the machine has no Docker, no cluster, no
# accelerator and no network at run time. Any other reason is an error.
NOT_RUN_REASONS = {
    "docker": "needs Docker",
    "kubernetes": "needs a Kubernetes cluster (kubectl, helm, kind)",
    "gpu": "needs a real accelerator",
    "external": "needs a program or service doppelchip's install does not provide, or the "
                "internet",
}
OUTPUT_MODES = frozenset({"exact", "wall"})

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass
class Fence:
    """One fenced block: where it is, its info string, its body (indentation removed)."""

    path: Path
    line: int  # 1-based line of the opening fence
    end_line: int  # 1-based line of the closing fence
    lang: str
    attrs: dict[str, str]
    body: list[str]
    indent: str


@dataclass
class ShellBlock:
    """A shell fence with the convention applied: commands, marker, quoted output."""

    fence: Fence
    commands: list[str]  # one entry per command, continuation lines joined with "\n"
    not_run: str | None = None
    output: Fence | None = None  # the `text output` fence after it
    output_mode: str = "exact"
    console_outputs: list[list[str]] = field(default_factory=list)  # console: per command

    @property
    def where(self) -> str:
        return f"{self.fence.path.name}:{self.fence.line}"

    @property
    def quoted_output(self) -> list[str] | None:
        if self.output is not None:
            return self.output.body
        if self.fence.lang == "console":
            return [line for out in self.console_outputs for line in out]
        return None


class DocError(ValueError):
    """The docs break the convention (unlabelled fence, unknown reason, orphan output)."""


def parse_info(info: str) -> tuple[str, dict[str, str]]:
    words = info.strip().split()
    if not words:
        return "", {}
    attrs: dict[str, str] = {}
    for w in words[1:]:
        key, _, value = w.partition("=")
        attrs[key] = value
    return words[0].lower(), attrs


def read_fences(path: Path) -> list[Fence]:
    lines = path.read_text().split("\n")
    fences: list[Fence] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m["fence"], m["indent"]
        j = i + 1
        while j < len(lines):
            close = _FENCE.match(lines[j])
            if close and close["fence"].startswith(fence) and not close["info"].strip():
                break
            j += 1
        if j == len(lines):
            raise DocError(f"{path.name}:{i + 1}: unclosed fence")
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip()
                for ln in lines[i + 1:j]]
        lang, attrs = parse_info(m["info"])
        fences.append(Fence(path, i + 1, j + 1, lang, attrs, body, indent))
        i = j + 1
    return fences


def split_commands(body: list[str]) -> list[str]:
    """Shell commands of a bash block: comments and blank lines dropped, a line ending in a
    backslash or inside an open quote continues into the next."""
    commands: list[str] = []
    current: list[str] = []
    for line in body:
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current.append(line)
        text = "\n".join(current)
        if line.rstrip().endswith("\\") or _open_quote(text):
            continue
        commands.append(text)
        current = []
    if current:
        commands.append("\n".join(current))
    return commands


def _open_quote(text: str) -> bool:
    """True when a quote opened in `text` is not closed (a JSON argument spanning lines)."""
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote == "'":
            quote = "" if ch == "'" else quote
        elif ch == "\\":
            i += 1  # the next character is escaped
        elif quote == '"':
            quote = "" if ch == '"' else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t\n"):
            nl = text.find("\n", i)  # a comment: its apostrophes are not quotes
            if nl < 0:
                break
            i = nl
        i += 1
    return bool(quote)


def split_console(body: list[str]) -> tuple[list[str], list[list[str]]]:
    """`$ ` prompts are commands (continued by trailing backslashes), other lines output."""
    commands: list[str] = []
    outputs: list[list[str]] = []
    continuing = False
    for line in body:
        if continuing:
            commands[-1] += "\n" + line
            continuing = line.rstrip().endswith("\\")
        elif line.startswith("$ "):
            commands.append(line[2:])
            outputs.append([])
            continuing = line.rstrip().endswith("\\")
        elif outputs:
            outputs[-1].append(line)
        elif line.strip():
            raise DocError(f"console block: output before the first `$ ` prompt: {line!r}")
    return commands, outputs


def shell_blocks(path: Path) -> list[ShellBlock]:
    """Every shell block of one Markdown file, with its marker and quoted output checked."""
    fences = read_fences(path)
    blocks: list[ShellBlock] = []
    for k, f in enumerate(fences):
        where = f"{path.name}:{f.line}"
        if not f.lang:
            raise DocError(f"{where}: a fence without an info string (bash, text, toml, ...)")
        if f.lang == "text" and "output" in f.attrs:
            prev = fences[k - 1] if k else None
            if prev is None or prev.lang not in SHELL_LANGS:
                raise DocError(f"{where}: `text output` does not follow a shell block")
            continue
        if f.lang not in SHELL_LANGS:
            continue
        if f.lang == "console":
            commands, outs = split_console(f.body)
        else:
            commands, outs = split_commands(f.body), []
        block = ShellBlock(f, commands, console_outputs=outs)
        if "not-run" in f.attrs:
            reason = f.attrs["not-run"]
            if reason not in NOT_RUN_REASONS:
                raise DocError(f"{where}: not-run={reason!r} is not one of "
                               f"{', '.join(NOT_RUN_REASONS)}")
            block.not_run = reason
        nxt = fences[k + 1] if k + 1 < len(fences) else None
        if nxt is not None and nxt.lang == "text" and "output" in nxt.attrs:
            mode = nxt.attrs["output"] or "exact"
            if mode not in OUTPUT_MODES:
                raise DocError(f"{path.name}:{nxt.line}: output={mode!r} is not one of "
                               f"{', '.join(sorted(OUTPUT_MODES))}")
            block.output, block.output_mode = nxt, mode
        blocks.append(block)
    return blocks


def doc_files(root: Path) -> list[Path]:
    """The checked docs: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]
