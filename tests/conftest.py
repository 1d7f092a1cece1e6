"""Shared fixtures: a real server on ephemeral loopback ports with a small, fast test fleet."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from server.config import parse_fleet

# time_scale 0.05: an emulated second takes 50 ms of wall time.
TEST_FLEET = {
    "server": {"host": "127.0.0.1", "port": 0, "metrics_port": 0, "time_scale": 0.05,
               "default_deployment": "fast", "drain_grace_s": 5.0},
    "deployments": [
        # Llama 3.1 8B on an H100 with vLLM: ~6 ms per output token (0.3 ms of wall time).
        {"name": "fast", "model": "llama-3.1-8b", "quant": "bf16", "chip": "h100-sxm",
         "engine": "vllm", "max_model_len": 256},
        # Llama 3.1 70B Q4 on an RTX 4090 box with llama.cpp offload: ~0.3 s per token (15 ms
        # of wall time), for cancel/deadline/drain tests; one sequence at a time and a
        # two-deep waiting queue for admission control.
        {"name": "slow", "model": "llama-3.1-70b", "quant": "q4_k_m", "chip": "rtx-4090",
         "engine": "llama.cpp", "max_num_seqs": 1, "max_waiting": 2},
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


def assert_released(engine) -> None:
    """Every KV block of `engine` is free or held only by the prefix cache; nothing in flight;
    the pool and cache invariants hold."""
    sched = engine.core.scheduler
    sched.check_integrity()
    assert engine.num_unfinished() == 0 and not sched.has_unfinished()
    assert sched.pool.num_free + sched.cache.evictable_blocks == sched.config.num_blocks
    status = engine.status()
    assert status.capacity.kv_blocks_free == status.capacity.kv_blocks_total


@pytest.fixture
async def client(app) -> AsyncIterator:
    from clients.client import AsyncClient

    async with AsyncClient(f"127.0.0.1:{app.port}") as c:
        yield c
