"""The on-disk memos of devices/ (the parsed catalogue, the fitted factor table): exact round
trip, never stale, never fatal.

The digest covers every input (devices/*.py, the catalogue TOMLs, the calibration points); the
tests change one byte of a copy of the package and check that what was stored for the old
inputs is not found, and that a file with the right name but another recorded digest is not
trusted either.
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
from devices import catalog
from devices import disk_cache as dc
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
    digest = dc.inputs_digest()
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
    """A memo written for one set of inputs is not used once any input changes."""
    tree = tmp_path / "devices"
    shutil.copytree(dc.ROOT, tree, ignore=shutil.ignore_patterns("__pycache__"))
    store = tmp_path / "cache"
    old = dc.inputs_digest(tree)
    assert old == dc.inputs_digest(dc.ROOT)  # a copy of the same bytes: the same key
    cc.store(old, _poisoned(fit(POINTS)), store)
    with (tree / victim).open("a") as f:
        f.write("\n# one more line\n")
    new = dc.inputs_digest(tree)
    assert new != old
    assert cc.load(new, store) is None
    fresh = fit(POINTS)
    got = cc.cached_fit(lambda: fresh, store, root=tree)
    assert got is fresh  # recomputed, not the poisoned table of the old inputs


def test_a_file_recording_another_digest_is_ignored(tmp_path: Path):
    digest = dc.inputs_digest()
    cc.store("0" * 64, _poisoned(fit(POINTS)), tmp_path)
    os.replace(dc.cache_path(cc.KIND, "0" * 64, tmp_path), dc.cache_path(cc.KIND, digest,
                                                                         tmp_path))
    assert cc.load(digest, tmp_path) is None


@pytest.mark.parametrize("content", ["", "{", "[]", '{"format": 1}', "null",
                                     '{"format": 1, "digest": "%s", "payload": [{}]}'])
def test_a_damaged_file_is_ignored(tmp_path: Path, content: str):
    digest = dc.inputs_digest()
    dc.cache_path(cc.KIND, digest, tmp_path).write_text(content.replace("%s", digest))
    assert cc.load(digest, tmp_path) is None
    fresh = fit(POINTS)
    assert cc.cached_fit(lambda: fresh, tmp_path) is fresh


def test_an_unwritable_directory_is_not_an_error(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    where = blocker / "cache"  # cannot be created, even by root
    assert not cc.store(dc.inputs_digest(), fit(POINTS), where)
    fresh = fit(POINTS)
    assert cc.cached_fit(lambda: fresh, where) is fresh


def test_an_unencodable_payload_writes_nothing(tmp_path: Path):
    assert not dc.write("catalog", "0" * 64, {"when": object()}, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_old_files_are_pruned_per_kind(tmp_path: Path):
    for i in range(dc.KEEP + 3):
        assert dc.write("factors", f"{i:064x}", [], tmp_path)
        os.utime(dc.cache_path("factors", f"{i:064x}", tmp_path), (i, i))
    assert dc.write("catalog", "f" * 64, {}, tmp_path)
    os.utime(dc.cache_path("catalog", "f" * 64, tmp_path), (0, 0))  # the oldest of all
    dc.prune("factors", tmp_path)
    kept = sorted(p.name for p in tmp_path.glob("factors-*.json"))
    assert kept == sorted(dc.cache_path("factors", f"{i:064x}", tmp_path).name
                          for i in range(3, dc.KEEP + 3))
    assert dc.cache_path("catalog", "f" * 64, tmp_path).exists()  # another kind: kept


def test_environment_picks_or_disables_the_directory(monkeypatch, tmp_path: Path):
    monkeypatch.setenv(dc.ENV, str(tmp_path))
    assert dc.cache_dir() == tmp_path
    monkeypatch.setenv(dc.ENV, "")
    assert dc.cache_dir() is None
    monkeypatch.delenv(dc.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert dc.cache_dir() == tmp_path / "xdg" / "doppelchip"


def test_catalogue_memo_equals_the_parsed_toml(tmp_path: Path):
    parsed = catalog.parse_tables()
    assert {"chips", "engines", "models", "quants", "links", "calibration"} <= set(parsed)
    assert dc.write("catalog", "1" * 64, parsed, tmp_path)
    assert dc.read("catalog", "1" * 64, tmp_path) == parsed
    assert catalog.toml("chips") == parsed["chips"]  # what this process read, memo or not


def test_a_command_writes_its_memos_then_reads_them(tmp_path: Path):
    """`doppelchip devices --json`: the first run parses, fits and stores; a later run reads
    those files (a doctored table under the same digest shows through, which is why the
    digest must cover every input); with the memo off the output is the first run's."""
    env = {**os.environ, dc.ENV: str(tmp_path)}
    cmd = [sys.executable, "-m", "doppelchip.cli", "devices", "--json"]

    def run(**extra: str) -> str:
        return subprocess.run(cmd, env={**env, **extra}, cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout

    first = run()
    digest = dc.inputs_digest()
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(
        dc.cache_path(kind, digest, tmp_path).name for kind in ("catalog", cc.KIND))
    assert run() == first
    assert cc.store(digest, _poisoned(fit(POINTS)), tmp_path)
    assert run() != first
    tables = catalog.parse_tables()
    tables["chips"]["chips"]["h100-sxm"]["name"] = "doctored H100"
    assert dc.write("catalog", digest, tables, tmp_path)
    assert "doctored H100" in run()
    assert run(**{dc.ENV: ""}) == first
