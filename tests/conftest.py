"""Shared fixtures: a real server on ephemeral loopback ports with a small, fast test fleet."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from server.config import parse_fleet

# time_scale 0.05: an emulated 20 ms step takes 1 ms of wall time.
TEST_FLEET = {
    "server": {"host": "127.0.0.1", "port": 0, "metrics_port": 0, "time_scale": 0.05,
               "default_deployment": "fast", "drain_grace_s": 5.0},
    "deployments": [
        {"name": "fast", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
         "engine": "vllm", "max_model_len": 256, "kv_blocks": 64},
        # Slow steps (emulated 0.4 s = 20 ms wall) for cancel/deadline/drain tests; one
        # sequence at a time and a two-deep waiting queue for admission control.
        {"name": "slow", "model": "llama-2-70b", "quant": "f16", "chip": "groq-lpu-v1",
         "engine": "groq", "max_model_len": 4096, "kv_blocks": 512, "max_num_seqs": 1,
         "max_waiting": 2, "decode_step_s": 0.4},
    ],
}


def make_fleet(overrides: dict | None = None):
    doc = {"server": dict(TEST_FLEET["server"]), "deployments": list(TEST_FLEET["deployments"])}
    if overrides:
        doc["server"].update(overrides)
    return parse_fleet(doc, "test fleet")


@pytest.fixture
async def app() -> AsyncIterator:
    from server.app import App

    application = App(make_fleet())
    await application.start()
    try:
        yield application
    finally:
        await application.drain(0.0)


@pytest.fixture
async def client(app) -> AsyncIterator:
    from clients.client import AsyncClient

    async with AsyncClient(f"127.0.0.1:{app.port}") as c:
        yield c
