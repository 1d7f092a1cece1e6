"""Fixtures of the HTTP tests (fixtures only: what tests import is in http_helpers.py): an
httpx client and the official `openai` client on the module's server's HTTP port."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest
from http_helpers import http_client, openai_client


@pytest.fixture
async def http(server) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(server) as c:
        yield c


@pytest.fixture
async def oai(server) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai_client(server) as c:
        yield c
