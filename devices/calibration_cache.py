"""The fitted factor table, memoised on disk (``devices.disk_cache``), so a command does not
refit at every start.

Why it exists: ``calibration.fit(POINTS)`` runs ``estimate`` a few hundred times (the
throughput points' golden-section searches) — about 0.2 s, most of a one-request
``doppelchip simulate``. The fit is pure: its result is a function of the calibration points,
the catalogue and the code of ``devices/`` — exactly what ``disk_cache.inputs_digest`` covers.

Contract: ``cached_fit(compute)`` reads the table stored for the current digest, else runs
``compute()`` and stores its result. A loaded table equals a computed one value for value and
in order, provenance included (``_encode``/``_decode`` keep every field; JSON keeps floats
exactly). ``load``/``store`` are the two halves, for a given digest and directory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from devices import disk_cache
from devices.factors import Factors, Provenance

Group = tuple[str, str]
Table = dict[Group, Factors]

KIND = "factors"


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
    """The table stored for ``digest`` in ``directory``, or None (absent, damaged, or
    recorded under another digest)."""
    rows = disk_cache.read(KIND, digest, directory)
    try:
        return None if rows is None else _decode(rows)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def store(digest: str, table: Table, directory: Path) -> bool:
    """Write ``table`` for ``digest``; False (and nothing raised) if it cannot."""
    return disk_cache.write(KIND, digest, _encode(table), directory)


def cached_fit(compute: Callable[[], Table], directory: Path | None = None,
               root: Path = disk_cache.ROOT) -> Table:
    """The table for the current inputs: read from ``directory`` (default
    ``disk_cache.cache_dir()``), else computed and stored there."""
    directory = disk_cache.cache_dir() if directory is None else directory
    if directory is None:
        return compute()
    try:
        digest = disk_cache.inputs_digest(root)
    except OSError:  # a source file unreadable: no key to trust, so no memo
        return compute()
    table = load(digest, directory)
    if table is None:
        table = compute()
        store(digest, table, directory)
    return table
