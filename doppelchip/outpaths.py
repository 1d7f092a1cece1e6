"""The output files and folders a command writes after its run (`--html`, `--output-csv`,
`--write-fleet`, `whatif --out`, ...), checked before the run starts.

Why it exists: a run can take minutes (`plan` searches a whole space); a path that cannot be
written is a usage error to report at once, in one line, not a traceback after the work is
done. A file is probed by opening it for appending (an existing file keeps its contents, a new
one is removed again); a folder by creating and removing a file in it, or in the nearest
folder above it that exists (the command creates the rest).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path


def file_problem(path: str) -> str:
    """Why the file `path` cannot be written ("" when it can)."""
    p = Path(path)
    if p.is_dir():
        return "is a directory"
    existed = p.exists()
    try:
        with open(p, "a"):
            pass
    except OSError as e:
        return e.strerror or str(e)
    if not existed:
        with contextlib.suppress(OSError):
            p.unlink()
    return ""


def dir_problem(path: str) -> str:
    """Why files cannot be written into the folder `path` ("" when they can)."""
    p = Path(path).absolute()
    if p.exists() and not p.is_dir():
        return "not a directory"
    while not p.exists():  # the folders the command will create: their first existing parent
        p = p.parent
    if not p.is_dir():
        return f"{p} is not a directory"
    return file_problem(str(p / f".doppelchip-write-check-{os.getpid()}"))


def unwritable(outputs: Iterable[tuple[str, str | None]], folders: Iterable[tuple[str, str | None]]
               = ()) -> str:
    """The first of the (flag, file) `outputs` and (flag, folder) `folders` that cannot be
    written, as an error message ("" when every given one can; None paths are skipped)."""
    for flag, path in outputs:
        if path and (why := file_problem(path)):
            return f"{flag} {path}: cannot write: {why}"
    for flag, path in folders:
        if path and (why := dir_problem(path)):
            return f"{flag} {path}: cannot write into it: {why}"
    return ""
