"""Shared fixtures: a real multi-process server on ephemeral loopback ports with a small, fast
test fleet (`fleets.TEST_FLEET`; one per test module: start-up costs a second), a client per
test. Fixtures only (so are tests/docs/conftest.py's), and the one hook that places tests on
pytest-xdist's workers: what tests import is in fleets.py and server_proc.py.

`make test` runs the suite on pytest-xdist's workers, one per core, a file at a time
(`--dist loadfile`, so a module's server starts once). The docs tests are one unit: the
fresh-clone run that tests/docs/conftest.py starts beside the documented blocks is awaited by
another file of theirs, and on two workers it would run twice."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from fleets import TEST_FLEET
from server_proc import ServerProcess


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile`, with tests/docs/ one scope (see the module docstring)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class DocsTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "tests/docs" if scope.startswith("tests/docs/") else scope

    return DocsTogether(config, log)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """The test fleet, served once per test module."""
    with ServerProcess(TEST_FLEET) as s:
        yield s


@pytest.fixture
async def client(server) -> AsyncIterator:
    from clients.client import AsyncClient

    async with AsyncClient(server.target) as c:
        yield c
