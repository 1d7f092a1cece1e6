"""README's quickstart and its examples, in order, in a fresh `git clone` of the committed HEAD
(issue 15; the test is tests/docs/test_readme_fresh_clone.py).

The blocks marked ```` ```bash fresh-clone ```` in README.md (the quickstart: `make run`,
`make test`, `generate`; the examples block; the baseline comparison) are run here only. A
reader runs the quickstart's `generate` in another shell while `make run` serves; here it talks
to the clone's own `doppelchip serve` of the default fleet, started once `make run` has built
the venv. The blocks run in the clone itself (not in a scratch folder of symlinks: pip writes
the path it runs from into the venv's scripts).

What a clone would fetch is reused, so that the run takes a minute on two cores, not ten:
`.cache/` (the Makefile's cache: Debian's prometheus for `make test`) is linked from this
checkout, and the clone's new `.venv` sees this checkout's installed distributions through a
`.pth` file, so `make run`'s and `make test`'s `pip install -e` find every dependency satisfied
and install only the clone itself (its editable finder is first on the path, so the clone's
code is what runs). `DOCCHECK_FULL_INSTALL=1` skips that and installs everything (minutes of
unpacking here); CI's `make test` on a clean clone installs from scratch anyway.

Why a module of its own: the run is mostly one core's work (pip, `make run`'s start, the
simulations), while the other docs blocks mostly wait on servers, so the docs tests start it in
a thread beside those (tests/docs/conftest.py) and the fresh-clone test reads its result.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

from scripts.doccheck.blocks import ShellBlock, shell_blocks
from scripts.doccheck.runner import Result, run_block, talks_to_server
from scripts.doccheck.shared import SharedServer


@dataclass
class FreshCloneRun:
    """What the run did: the clone's README's fresh-clone blocks; each one's result in that
    order, up to the first that failed; the clone's shared server's exit status on SIGTERM and
    its log; each block's seconds."""

    blocks: list[ShellBlock] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)
    server_rc: int | None = None
    server_log: str = ""
    timings: list[str] = field(default_factory=list)


def fresh_clone_blocks(readme: Path) -> list[ShellBlock]:
    return [b for b in shell_blocks(readme) if "fresh-clone" in b.fence.attrs]


def reuse_installed_distributions(clone: Path) -> None:
    """clone/.venv, empty but for a .pth that adds this checkout's site-packages after its own
    (`make run` then installs only the clone)."""
    subprocess.run([sys.executable, "-m", "venv", str(clone / ".venv")], check=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    theirs = clone / ".venv" / "lib" / version / "site-packages"
    # the clone's own __editable__ .pth sorts (and so registers its finder) before this one
    (theirs / "_zz_doccheck_reuse.pth").write_text(f"import site; site.addsitedir({str(ours)!r})\n")


def run_fresh_clone(root: Path, workdir: Path) -> FreshCloneRun:
    """Clone `root` into `workdir`, run README's fresh-clone blocks there in order (stopping at
    the first that exits non-zero), then stop the clone's shared server."""
    clone = workdir / "doppelchip"
    subprocess.run(["git", "clone", "--quiet", str(root), str(clone)], check=True)
    if (root / ".cache").is_dir():
        (clone / ".cache").symlink_to(root / ".cache")
    if not os.environ.get("DOCCHECK_FULL_INSTALL"):
        reuse_installed_distributions(clone)
    server = SharedServer(clone)
    run = FreshCloneRun(fresh_clone_blocks(clone / "README.md"))
    try:
        for block in run.blocks:
            fixed = server.ensure() if talks_to_server(block) else None
            start = time.monotonic()
            result = run_block(block, clone, fixed, timeout=600, in_place=True)
            run.timings.append(f"{block.where} {time.monotonic() - start:.0f} s")
            run.results.append(result)
            if not result.ok:
                break
    finally:
        run.server_rc = server.stop()
        run.server_log = server.log
    return run
