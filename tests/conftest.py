"""Shared fixtures: a real multi-process server on ephemeral loopback ports with a small, fast
test fleet (`fleets.TEST_FLEET`; one per test module: start-up costs a second), a client per
test. Fixtures only (so are tests/docs/conftest.py's): what tests import is in fleets.py and
server_proc.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from fleets import TEST_FLEET
from server_proc import ServerProcess


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
