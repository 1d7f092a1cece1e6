"""An on-disk memo of the default factor table, so a command does not refit at every start.

Why it exists: ``calibration.fit(POINTS)`` runs ``estimate`` a few hundred times (the
throughput points' golden-section searches) — about 0.2 s, most of a one-request
``doppelchip simulate``. The fit is pure: its result is a function of the calibration points,
the catalogue and the code of ``devices/``, nothing else. So the table is stored once, keyed by
a digest of exactly those inputs, and read back by later processes.

Contract:
- ``inputs_digest(root)``: SHA-256 over every ``*.py`` and ``*.toml`` file under ``root`` (the
  ``devices`` package: the fitting code, the cost model it calls, the catalogue TOMLs and the
  calibration points in ``catalog/calibration.toml``), by relative path and bytes, plus the
  cache format and the interpreter (its version and float format). Any changed byte in any of
  them gives another digest, hence another file name: a stale table is never found.
- ``load(digest, directory)``: the stored table, or None when there is none, it does not
  parse, or the digest recorded inside it differs (a file copied or renamed by hand).
- ``store(digest, table, directory)``: writes atomically (a temporary file, then
  ``os.replace``), so concurrent processes see the old file or the whole new one; any
  ``OSError`` (directory absent and not creatable, read-only, disk full) leaves the cache
  unwritten and is not an error. Keeps the ``KEEP`` most recent tables (worktrees with other
  code share the directory).
- ``cached_fit(compute)``: ``load``, else ``compute()`` then ``store``. Floats round-trip
  exactly (JSON writes ``repr``), and the groups keep their order, so a loaded table equals a
  computed one value for value, provenance included.

The directory: ``$DOPPELCHIP_CACHE_DIR`` if set (empty: no disk cache at all), else
``$XDG_CACHE_HOME/doppelchip``, else ``~/.cache/doppelchip``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devices.factors import Factors, Provenance

Group = tuple[str, str]
Table = dict[Group, Factors]

FORMAT = 1  # bump when the file layout changes
KEEP = 8  # most recent tables kept in the directory
ROOT = Path(__file__).resolve().parent  # the devices package: every input of the fit
ENV = "DOPPELCHIP_CACHE_DIR"


def cache_dir() -> Path | None:
    """Where tables are kept (None: disk cache switched off by an empty $DOPPELCHIP_CACHE_DIR)."""
    if ENV in os.environ:
        return Path(os.environ[ENV]) if os.environ[ENV] else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "doppelchip"


def inputs_digest(root: Path = ROOT) -> str:
    """SHA-256 of every input of the fit (see the module contract)."""
    h = hashlib.sha256()
    h.update(f"format {FORMAT}\n{sys.version}\n{sys.float_info!r}\n".encode())
    files = sorted(p for ext in ("*.py", "*.toml") for p in root.rglob(ext)
                   if "__pycache__" not in p.parts)
    for path in files:
        data = path.read_bytes()
        h.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def cache_path(digest: str, directory: Path) -> Path:
    return directory / f"factors-{digest}.json"


def _encode(table: Table) -> list[dict[str, Any]]:
    return [{"group": list(g), "bw_eff": f.bw_eff, "flop_eff": f.flop_eff,
             "kernel_s": f.kernel_s,
             "provenance": [[name, p.kind, list(p.points), p.source, p.note]
                            for name, p in f.provenance]}
            for g, f in table.items()]


def _decode(rows: list[dict[str, Any]]) -> Table:
    out: Table = {}
    for r in rows:
        engine, cls = r["group"]
        prov = tuple((name, Provenance(kind, tuple(points), source, note))
                     for name, kind, points, source, note in r["provenance"])
        out[(engine, cls)] = Factors(float(r["bw_eff"]), float(r["flop_eff"]),
                                     float(r["kernel_s"]), prov)
    return out


def load(digest: str, directory: Path) -> Table | None:
    """The table stored for ``digest`` in ``directory``, or None (absent, unreadable, not
    parseable, or recorded under another digest)."""
    try:
        raw = json.loads(cache_path(digest, directory).read_text())
        if raw.get("format") != FORMAT or raw.get("digest") != digest:
            return None
        return _decode(raw["table"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def store(digest: str, table: Table, directory: Path) -> bool:
    """Write ``table`` for ``digest`` atomically; False (and nothing raised) if it cannot."""
    import tempfile  # only when writing: a start-up that reads the table skips it

    text = json.dumps({"format": FORMAT, "digest": digest, "table": _encode(table)})
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".factors-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, cache_path(digest, directory))
        except BaseException:
            os.unlink(tmp)
            raise
        _prune(directory)
    except OSError:
        return False
    return True


def _prune(directory: Path) -> None:
    """Drop all but the KEEP most recently written tables (best effort)."""
    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0

    tables = sorted(directory.glob("factors-*.json"), key=mtime, reverse=True)
    for old in tables[KEEP:]:
        with contextlib.suppress(OSError):
            old.unlink()


def cached_fit(compute: Callable[[], Table], directory: Path | None = None,
               root: Path = ROOT) -> Table:
    """The table for the current inputs: read from ``directory`` (default ``cache_dir()``),
    else computed and stored there."""
    directory = cache_dir() if directory is None else directory
    if directory is None:
        return compute()
    try:
        digest = inputs_digest(root)
    except OSError:  # a source file unreadable: no key to trust, so no cache
        return compute()
    table = load(digest, directory)
    if table is None:
        table = compute()
        store(digest, table, directory)
    return table
