"""Every shell command in README.md and docs/*.md is run here, or marked as not run for an
allowed reason (the convention: docs/DOCS_TESTS.md), and every quoted output still matches.

How the commands reach servers: a block that starts one (`doppelchip serve|pods|gateway`,
`make run`, `make gateway`, `smg launch`) gets its own, probed until ready and stopped at the
block's end; a block that only talks to one (curl, `generate`) talks to one shared
`doppelchip serve` of the default fleet. Every documented port is moved by an offset to a free
loopback port (scripts/doccheck/commands.py); quoted outputs see the documented ports again.
Blocks of one doc run in order, one per test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.doccheck.blocks import NOT_RUN_REASONS, doc_files, shell_blocks
from scripts.doccheck.outputs import json_last_problems, mismatch
from scripts.doccheck.runner import run_blocks
from scripts.doccheck.shared import SharedServer

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = [b for path in doc_files(ROOT) for b in shell_blocks(path)]
# README's quickstart and examples run from a fresh clone instead (test_readme_fresh_clone.py)
RUN = [b for b in BLOCKS if b.not_run is None and "fresh-clone" not in b.fence.attrs]


@pytest.fixture(scope="module")
def results(start_fresh_clone):
    """Every runnable block, run once, several at a time (the tests below read the results);
    the fresh-clone run (conftest.py) is started first, to run beside them."""
    server = SharedServer(ROOT)
    try:
        yield run_blocks(RUN, ROOT, server.ensure)
    finally:
        rc = server.stop()
    assert rc in (None, 0), f"the shared server exited {rc} on SIGTERM:\n{server.log}"


def test_every_doc_follows_the_convention():
    # shell_blocks raised on an unlabelled fence or an unknown reason while collecting
    assert len(BLOCKS) > 20 and len(RUN) > 20


def test_marked_commands_are_listed_with_an_allowed_reason(capsys):
    marked = [b for b in BLOCKS if b.not_run is not None]
    with capsys.disabled():
        print(f"\n{len(marked)} documented blocks not run here:")
        for b in marked:
            first = b.commands[0].split("\n")[0] if b.commands else ""
            print(f"  {b.where:<18} not-run={b.not_run:<11} {first[:70]}")
    assert all(b.not_run in NOT_RUN_REASONS for b in marked)


@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_documented_block_runs_and_prints_what_is_quoted(block, results):
    result = results[block.where]
    assert result.ok, (f"{block.where} exited {result.returncode}:\n{result.output}\n"
                       f"server logs:\n{result.logs[-4000:]}")
    diff = mismatch(block, result)
    assert diff is None, (f"{block.where}: the quoted output changed "
                          f"(scripts/docs_outputs.py --write regenerates it):\n{diff}")
    assert not (bad := json_last_problems(block, result.output)), bad

