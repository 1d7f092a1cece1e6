"""On-disk memos of what ``devices`` derives from its own files (the parsed catalogue, the
fitted factor table), so a command does not redo that work at every start.

Why it exists: a one-request ``doppelchip simulate`` spent most of its start-up parsing the
catalogue TOMLs and refitting the calibration; both are pure functions of the files of the
``devices`` package (its code, the catalogue and the calibration points) and of the
interpreter. So each result is stored once, keyed by a digest of exactly those inputs.

Contract:
- ``inputs_digest(root)``: SHA-256 over every ``*.py`` and ``*.toml`` file under ``root`` (by
  relative path and bytes), the memo format and the platform (interpreter version, machine,
  C library, float format). Any changed byte of any input gives another digest, hence another
  file name: a stale memo is never found. Computed once per process for the package itself.
- ``read(kind, digest, directory)``: the stored payload, or None when there is none, it does
  not parse, or the digest or format recorded inside differs (a file copied by hand).
- ``write(kind, digest, payload, directory)``: JSON, written atomically (a temporary file, then
  ``os.replace``), so concurrent processes see the old file or the whole new one; any
  ``OSError`` or unencodable payload leaves nothing written and is not an error. Keeps the
  ``KEEP`` most recent files of each kind (worktrees with other code share the directory).
- JSON keeps floats exactly (``repr``) and dict order, so what is read equals what was written.

The directory: ``$DOPPELCHIP_CACHE_DIR`` if set (empty: no disk memo at all), else
``$XDG_CACHE_HOME/doppelchip``, else ``~/.cache/doppelchip``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

FORMAT = 1  # bump when a file layout changes
KEEP = 8  # most recent files of each kind kept in the directory
ROOT = Path(__file__).resolve().parent  # the devices package: every input
ENV = "DOPPELCHIP_CACHE_DIR"


def cache_dir() -> Path | None:
    """Where memos are kept (None: switched off by an empty $DOPPELCHIP_CACHE_DIR)."""
    if ENV in os.environ:
        return Path(os.environ[ENV]) if os.environ[ENV] else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "doppelchip"


def inputs_digest(root: Path = ROOT) -> str:
    """SHA-256 of every input under ``root`` (see the module contract)."""
    return _package_digest() if root == ROOT else _digest(root)


@functools.cache
def _package_digest() -> str:
    return _digest(ROOT)


def _platform() -> str:
    """The interpreter and the maths library the floats came from (a home directory shared
    by other machines may hold another's memo)."""
    machine = os.uname().machine if hasattr(os, "uname") else ""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        libc = ""
    return f"{sys.version}\n{sys.platform} {machine} {libc}\n{sys.float_info!r}"


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    h.update(f"format {FORMAT}\n{_platform()}\n".encode())
    files = sorted(p for ext in ("*.py", "*.toml") for p in root.rglob(ext)
                   if "__pycache__" not in p.parts)
    for path in files:
        data = path.read_bytes()
        h.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def cache_path(kind: str, digest: str, directory: Path) -> Path:
    return directory / f"{kind}-{digest}.json"


def read(kind: str, digest: str, directory: Path) -> Any | None:
    """The payload stored for ``digest``, or None (absent, unreadable, not parseable, or
    recorded under another digest or format)."""
    try:
        raw = json.loads(cache_path(kind, digest, directory).read_text())
        if raw.get("format") != FORMAT or raw.get("digest") != digest:
            return None
        return raw["payload"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write(kind: str, digest: str, payload: Any, directory: Path) -> bool:
    """Store ``payload`` for ``digest`` atomically; False (nothing raised) if it cannot."""
    import tempfile  # only when writing: a start-up that reads its memos skips it

    try:
        text = json.dumps({"format": FORMAT, "digest": digest, "payload": payload})
    except (TypeError, ValueError):  # not JSON (a TOML datetime, say): keep no memo
        return False
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{kind}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, cache_path(kind, digest, directory))
        except BaseException:
            os.unlink(tmp)
            raise
        prune(kind, directory)
    except OSError:
        return False
    return True


def prune(kind: str, directory: Path) -> None:
    """Drop all but the KEEP most recently written files of ``kind`` (best effort)."""
    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0

    files = sorted(directory.glob(f"{kind}-*.json"), key=mtime, reverse=True)
    for old in files[KEEP:]:
        with contextlib.suppress(OSError):
            old.unlink()
