"""README's quickstart and its examples, in order, from a fresh `git clone` (issue 15).

The blocks marked ```` ```bash fresh-clone ```` in README.md (the quickstart: `make run`,
`make test`, `generate`; the examples block; the baseline comparison) are run by this test only,
in a clone of the committed HEAD. A reader runs the quickstart's `generate` in another shell
while `make run` serves; here it talks to the clone's own `doppelchip serve` of the default
fleet, started once `make run` has built the venv. The blocks run in the clone itself (not in a
scratch folder of symlinks: pip writes the path it runs from into the venv's scripts).

What a clone would fetch is reused, so that the test takes a few minutes on two cores, not ten:
`.cache/` (the Makefile's cache: Debian's prometheus for `make test`) is linked from this
checkout, and the clone's new `.venv` sees this checkout's installed distributions through a
`.pth` file, so `make run`'s and `make test`'s `pip install -e` find every dependency satisfied
and install only the clone itself (its editable finder is first on the path, so the clone's
code is what runs). `DOCCHECK_FULL_INSTALL=1` skips that and installs everything (minutes of
unpacking here); CI's `make test` on a clean clone installs from scratch anyway.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from scripts.doccheck.blocks import shell_blocks
from scripts.doccheck.outputs import json_last_problems, mismatch
from scripts.doccheck.runner import run_block, talks_to_server
from scripts.doccheck.shared import SharedServer

ROOT = Path(__file__).resolve().parents[2]


def fresh_clone_blocks(readme: Path) -> list:
    return [b for b in shell_blocks(readme) if "fresh-clone" in b.fence.attrs]


def test_readme_marks_its_quickstart_and_examples():
    blocks = fresh_clone_blocks(ROOT / "README.md")
    commands = [c for b in blocks for c in b.commands]
    assert any(c.startswith("make run") for c in commands)
    assert any("--kv-layout contiguous --batching static" in c for c in commands)
    assert any("examples/order.json" in c for c in commands)
    assert all(b.not_run is None for b in blocks)


def reuse_installed_distributions(clone: Path) -> None:
    """clone/.venv, empty but for a .pth that adds this checkout's site-packages after its own
    (`make run` then installs only the clone)."""
    subprocess.run([sys.executable, "-m", "venv", str(clone / ".venv")], check=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    theirs = clone / ".venv" / "lib" / version / "site-packages"
    # the clone's own __editable__ .pth sorts (and so registers its finder) before this one
    (theirs / "_zz_doccheck_reuse.pth").write_text(f"import site; site.addsitedir({str(ours)!r})\n")


@pytest.mark.slow
def test_readme_quickstart_and_examples_from_a_fresh_clone(tmp_path):
    clone = tmp_path / "doppelchip"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    if (ROOT / ".cache").is_dir():
        (clone / ".cache").symlink_to(ROOT / ".cache")
    if not os.environ.get("DOCCHECK_FULL_INSTALL"):
        reuse_installed_distributions(clone)
    server = SharedServer(clone)
    timings = []
    try:
        for block in fresh_clone_blocks(clone / "README.md"):
            fixed = server.ensure() if talks_to_server(block) else None
            start = time.monotonic()
            result = run_block(block, clone, fixed, timeout=600, in_place=True)
            timings.append(f"{block.where} {time.monotonic() - start:.0f} s")
            assert result.ok, (f"{block.where} exited {result.returncode} in a fresh clone:\n"
                               f"{result.output[-6000:]}\nserver logs:\n{result.logs[-3000:]}")
            diff = mismatch(block, result)
            assert diff is None, f"{block.where}: the quoted output changed:\n{diff}"
            assert not (bad := json_last_problems(block, result.output)), bad
    finally:
        rc = server.stop()
        print("fresh clone:", ", ".join(timings))
    assert rc in (None, 0), server.log
