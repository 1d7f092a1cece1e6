"""README's quickstart and its examples, in order, from a fresh `git clone` (issue 15).

The run itself (what it reuses from this checkout, why) is `scripts/doccheck/fresh_clone.py`;
it starts in a thread when the docs tests start (tests/docs/conftest.py), beside the other
documented blocks, and this test checks what it did.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest

from scripts.doccheck.fresh_clone import FreshCloneRun, fresh_clone_blocks
from scripts.doccheck.outputs import json_last_problems, mismatch

ROOT = Path(__file__).resolve().parents[2]


def test_readme_marks_its_quickstart_and_examples():
    blocks = fresh_clone_blocks(ROOT / "README.md")
    commands = [c for b in blocks for c in b.commands]
    assert any(c.startswith("make run") for c in commands)
    assert any("--kv-layout contiguous --batching static" in c for c in commands)
    assert any("examples/order.json" in c for c in commands)
    assert all(b.not_run is None for b in blocks)


@pytest.mark.slow
def test_readme_quickstart_and_examples_from_a_fresh_clone(fresh_clone: Future[FreshCloneRun]):
    run = fresh_clone.result()
    print("fresh clone:", ", ".join(run.timings))
    assert len(run.blocks) >= 3
    for result in run.results:
        where = result.block.where
        assert result.ok, (f"{where} exited {result.returncode} in a fresh clone:\n"
                           f"{result.output[-6000:]}\nserver logs:\n{result.logs[-3000:]}")
        diff = mismatch(result.block, result)
        assert diff is None, f"{where}: the quoted output changed:\n{diff}"
        assert not (bad := json_last_problems(result.block, result.output)), bad
    assert [r.block for r in run.results] == run.blocks  # every block ran, in order
    assert run.server_rc in (None, 0), run.server_log
