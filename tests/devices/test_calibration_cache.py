"""The on-disk memo of the fitted factor table: exact round trip, never stale, never fatal.

The digest covers every input of the fit (devices/*.py, the catalogue TOMLs, the calibration
points); the tests change one byte of a copy of the package and check that the table stored
for the old inputs is not found, and that a file with the right name but another recorded
digest is not trusted either.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devices import calibration_cache as cc
from devices.calibration import POINTS, fit

ROOT = Path(__file__).resolve().parents[2]


def _same(a: cc.Table, b: cc.Table) -> None:
    """Value for value, in order, provenance included (Factors' == ignores provenance)."""
    assert list(a) == list(b)
    for g in a:
        assert repr(a[g]) == repr(b[g]), g
        assert a[g].provenance == b[g].provenance, g


def _poisoned(table: cc.Table) -> cc.Table:
    return {g: dataclasses.replace(f, bw_eff=f.bw_eff / 2) for g, f in table.items()}


def test_round_trip_is_exact(tmp_path: Path):
    table = fit(POINTS)
    digest = cc.inputs_digest()
    assert cc.load(digest, tmp_path) is None
    assert cc.store(digest, table, tmp_path)
    _same(cc.load(digest, tmp_path), table)


def test_cached_fit_computes_once_then_reads(tmp_path: Path):
    calls = []

    def compute() -> cc.Table:
        calls.append(1)
        return fit(POINTS)

    first = cc.cached_fit(compute, tmp_path)
    second = cc.cached_fit(compute, tmp_path)
    assert len(calls) == 1
    _same(first, second)


@pytest.mark.parametrize("victim", ["catalog/calibration.toml", "catalog/chips.toml",
                                    "catalog/engines.toml", "calibration.py", "cost.py"])
def test_a_changed_input_never_finds_the_old_table(tmp_path: Path, victim: str):
    """A cache written for one set of inputs is not used once any input changes."""
    tree = tmp_path / "devices"
    shutil.copytree(cc.ROOT, tree, ignore=shutil.ignore_patterns("__pycache__"))
    store = tmp_path / "cache"
    old = cc.inputs_digest(tree)
    assert old == cc.inputs_digest(cc.ROOT)  # a copy of the same bytes: the same key
    cc.store(old, _poisoned(fit(POINTS)), store)
    with (tree / victim).open("a") as f:
        f.write("\n# one more line\n")
    new = cc.inputs_digest(tree)
    assert new != old
    assert cc.load(new, store) is None
    fresh = fit(POINTS)
    got = cc.cached_fit(lambda: fresh, store, root=tree)
    assert got is fresh  # recomputed, not the poisoned table of the old inputs


def test_a_file_recording_another_digest_is_ignored(tmp_path: Path):
    digest = cc.inputs_digest()
    cc.store("0" * 64, _poisoned(fit(POINTS)), tmp_path)
    os.replace(cc.cache_path("0" * 64, tmp_path), cc.cache_path(digest, tmp_path))
    assert cc.load(digest, tmp_path) is None


@pytest.mark.parametrize("content", ["", "{", "[]", '{"format": 1}', "null"])
def test_a_damaged_file_is_ignored(tmp_path: Path, content: str):
    digest = cc.inputs_digest()
    cc.cache_path(digest, tmp_path).write_text(content)
    assert cc.load(digest, tmp_path) is None
    fresh = fit(POINTS)
    assert cc.cached_fit(lambda: fresh, tmp_path) is fresh


def test_an_unwritable_directory_is_not_an_error(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    where = blocker / "cache"  # cannot be created, even by root
    assert not cc.store(cc.inputs_digest(), fit(POINTS), where)
    fresh = fit(POINTS)
    assert cc.cached_fit(lambda: fresh, where) is fresh


def test_old_tables_are_pruned(tmp_path: Path):
    table = fit(POINTS)
    for i in range(cc.KEEP + 3):
        assert cc.store(f"{i:064x}", table, tmp_path)
        os.utime(cc.cache_path(f"{i:064x}", tmp_path), (i, i))
    cc._prune(tmp_path)
    kept = sorted(p.name for p in tmp_path.glob("factors-*.json"))
    assert kept == sorted(cc.cache_path(f"{i:064x}", tmp_path).name
                          for i in range(3, cc.KEEP + 3))


def test_environment_picks_or_disables_the_directory(monkeypatch, tmp_path: Path):
    monkeypatch.setenv(cc.ENV, str(tmp_path))
    assert cc.cache_dir() == tmp_path
    monkeypatch.setenv(cc.ENV, "")
    assert cc.cache_dir() is None
    monkeypatch.delenv(cc.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cc.cache_dir() == tmp_path / "xdg" / "doppelchip"


def test_a_command_writes_the_table_then_reads_it(tmp_path: Path):
    """`doppelchip devices --json`: the first run fits and stores the table; a later run reads
    that file (a doctored copy under the same digest shows through, which is why the digest
    must cover every input); with the disk cache off the output is the first run's."""
    env = {**os.environ, cc.ENV: str(tmp_path)}
    cmd = [sys.executable, "-m", "doppelchip.cli", "devices", "--json"]

    def run(**extra: str) -> str:
        return subprocess.run(cmd, env={**env, **extra}, cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout

    first = run()
    digest = cc.inputs_digest()
    assert [p.name for p in tmp_path.glob("factors-*.json")] == [
        cc.cache_path(digest, tmp_path).name]
    assert run() == first
    assert cc.store(digest, _poisoned(fit(POINTS)), tmp_path)
    assert run() != first
    assert run(**{cc.ENV: ""}) == first
