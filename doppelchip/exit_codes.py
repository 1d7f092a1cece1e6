"""The exit codes of every `doppelchip` command: one scheme, printed in each command's `--help`.

Why this exists: a script driving the CLI (or the docs tests) tells "the server said no" from
"you called me wrong" from "you pressed Ctrl-C" by the exit status alone, whichever command
it ran, so the numbers live in one place and `cli.py` appends the same table to every
subcommand's help.
"""

from __future__ import annotations

import argparse

OK = 0
FAILED = 1  # the request, the run or a child process failed (a gRPC status, a crash)
USAGE = 2  # bad flags or bad input (argparse's own code, unreadable files, invalid configs)
INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as shells report it)

EPILOG = """\
exit status:
  0    success
  1    failure: the server answered with an error status (printed as
       "error: STATUS_NAME: message" on stderr), a run or a child process failed
  2    usage error or bad input (unknown flag, unreadable file, invalid config,
       a deployment that does not fit)
  130  interrupted (Ctrl-C); `serve`, `pods` and `gateway` treat SIGINT/SIGTERM
       as their normal stop instead: they drain and exit 0"""


class EpilogFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that the exit-status table keeps its layout (argparse
    would re-wrap it into one paragraph; descriptions are still wrapped as usual)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith(EPILOG.splitlines()[0]):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def document(parser: argparse.ArgumentParser) -> None:
    """Append the exit-status table to `parser`'s help, keeping its own formatter class."""
    parser.epilog = EPILOG
    base = parser.formatter_class
    if not (isinstance(base, type) and issubclass(base, EpilogFormatter)):
        parser.formatter_class = type("EpilogFormatter", (EpilogFormatter, base), {})
