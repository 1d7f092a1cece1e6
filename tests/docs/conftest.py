"""The fresh-clone run of README's quickstart (scripts/doccheck/fresh_clone.py), started once
per session in a thread of its own.

Why in a thread: it is mostly one core's work (pip, a server's start, simulations) while the
other documented blocks (test_docs_commands.py) mostly wait on their servers, so the docs tests
start it before theirs and it runs beside them; test_readme_fresh_clone.py waits for its end.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from scripts.doccheck.fresh_clone import FreshCloneRun, run_fresh_clone

ROOT = Path(__file__).resolve().parents[2]
FRESH_CLONE_TEST = "test_readme_quickstart_and_examples_from_a_fresh_clone"

@pytest.fixture(scope="session")
def fresh_clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Future[FreshCloneRun]]:
    """The run, started at the first request; its end is awaited at the session's end."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="fresh-clone")
    try:
        yield pool.submit(run_fresh_clone, ROOT, tmp_path_factory.mktemp("fresh-clone"))
    finally:
        pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def start_fresh_clone(request: pytest.FixtureRequest) -> None:
    """Starts the fresh-clone run now if this session runs its test (not deselected, e.g. by
    `-m 'not slow'`, or left out by a path)."""
    if any(item.name == FRESH_CLONE_TEST for item in request.session.items):
        request.getfixturevalue("fresh_clone")
