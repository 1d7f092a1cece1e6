"""vLLM 0.34.0's process-checkpoint routes on a pod started with `--enable-sleep-mode`:
`/checkpoint/prepare` drains (mode wait: the running request finishes, the queued one stays
queued; mode keep: the running one is frozen, then preempted with the KV cache's release) and
releases the KV cache, `/checkpoint/status` answers 503 until prepared and 200 then,
`/checkpoint/restore` brings the pod back serving; sleep, wake-up and resume are refused (500,
vLLM's engine errors) meanwhile, and requests with a retryable 503. Without the flag the
routes do not exist, as in vLLM; `--checkpoint-prepare-on-startup` starts prepared and needs
the flag. Every request is released afterwards."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest
from fleets import assert_released, fleet_doc
from http_helpers import http_client
from server_proc import ROOT, ServerProcess
from test_http_pause import POD, PROMPT, Stream, body, running_and_queued

from clients.client import AsyncClient
from server.engine_proc.pause import PAUSED_MESSAGE

DEV = {"VLLM_SERVER_DEV_MODE": "1"}  # for /resume's refusal


def doc(**extra) -> dict:
    return fleet_doc({"time_scale": 1.0, "api_server_count": 1, "drain_grace_s": 1.0},
                     [{**POD, "enable_sleep_mode": True, **extra}])


@pytest.fixture(scope="module")
def server():
    with ServerProcess(doc(), env=DEV) as s:
        yield s


@pytest.fixture
async def client(server):
    async with AsyncClient(server.target) as c:
        yield c


async def status(http: httpx.AsyncClient) -> tuple[int, dict]:
    r = await http.get("/checkpoint/status")
    return r.status_code, r.json()


async def until_prepared(http: httpx.AsyncClient) -> None:
    for _ in range(3000):  # an orchestrator's poll, bounded (~30 s)
        if (await status(http))[0] == 200:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never prepared: {await status(http)}")


async def test_an_idle_pod_prepares_refuses_everything_then_restores(server, client):
    async with http_client(server) as http:
        assert await status(http) == (503, {"state": "running"})
        cached = await http.post("/v1/completions", json=body(2))
        assert cached.status_code == 200
        r = await http.post("/checkpoint/prepare")
        assert r.status_code == 200 and r.json() == {"state": "prepared"}  # nothing to drain
        assert await status(http) == (200, {"state": "prepared"})
        r = await http.post("/checkpoint/prepare", params={"mode": "abort"})
        assert r.status_code == 200 and r.json() == {"state": "prepared"}  # a no-op
        r = await http.post("/v1/completions", json=body(2))
        assert r.status_code == 503 and r.json()["error"]["message"] == PAUSED_MESSAGE
        for path, method, doing in (("/sleep", "sleep", "sleep"),
                                    ("/wake_up", "wake_up", "wake up")):
            r = await http.post(path)
            assert r.status_code == 500 and r.json()["error"]["message"] == (
                f"Call to {method} method failed: Cannot {doing} while the checkpoint state "
                "is prepared")
        r = await http.post("/resume")
        assert r.status_code == 500 and r.json() == {"error": (
            "Failed to resume generation: Call to resume_scheduler method failed: Cannot "
            "resume scheduling while the checkpoint state is prepared")}
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": True}
        r = await http.post("/checkpoint/restore")
        assert r.status_code == 200 and r.json() == {"state": "running"}
        assert await status(http) == (503, {"state": "running"})
        r = await http.post("/checkpoint/restore")
        assert r.status_code == 200 and r.json() == {"state": "running"}  # redelivered
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": False}
        again = await http.post("/v1/completions", json=body(2))
        assert again.status_code == 200  # serving, its prefix released with the KV cache
        assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    await assert_released(client, "pod")


async def test_mode_wait_drains_the_running_request_and_keeps_the_queued_one(server, client):
    async with http_client(server) as http:
        running, held = await running_and_queued(http, client, 60, 8)
        r = await http.post("/checkpoint/prepare")  # returns once started
        assert r.status_code == 200 and r.json() == {"state": "preparing"}
        r = await http.post("/checkpoint/restore")
        assert r.status_code == 400 and r.json() == {"state": "preparing"}
        r = await http.post("/v1/completions", json=body(2))
        assert r.status_code == 503
        await until_prepared(http)
        assert await running.ended() == "length" and running.tokens == 60
        d = await client.get_deployment("pod")
        assert d.load.num_running == 0 and d.load.num_waiting == 1 and not held.done()
        assert (await http.post("/checkpoint/restore")).json() == {"state": "running"}
        r = await held
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
    await assert_released(client, "pod")


async def test_mode_keep_preempts_the_frozen_request_which_recomputes_after_the_restore(
        server, client):
    async with http_client(server) as http:
        frozen = Stream(http, 60)
        await frozen.started.wait()
        r = await http.post("/checkpoint/prepare", params={"mode": "keep"})
        assert r.status_code == 200 and r.json() == {"state": "prepared"}
        d = await client.get_deployment("pod")
        assert d.load.num_running == 0 and d.load.num_waiting == 1  # its KV released
        assert d.capacity.kv_blocks_free == d.capacity.kv_blocks_total
        assert (await http.post("/checkpoint/restore")).json() == {"state": "running"}
        assert await frozen.ended() == "length" and frozen.tokens == 60
    await assert_released(client, "pod")


async def test_an_asleep_engine_is_refused_and_nothing_changes(server, client):
    async with http_client(server) as http:
        assert (await http.post("/sleep", params={"level": 1})).status_code == 200
        r = await http.post("/checkpoint/prepare")
        assert r.status_code == 400 and r.json() == {
            "state": "running", "error": "Preparing for a checkpoint requires an awake engine"}
        assert (await http.post("/wake_up")).json()["status"] == "awake"
        r = await http.post("/v1/completions", json=body(2))
        assert r.status_code == 200
    await assert_released(client, "pod")


async def test_a_bad_mode_is_a_400_naming_it(server):
    async with http_client(server) as http:
        r = await http.post("/checkpoint/prepare", params={"mode": "later"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "query.mode"
        assert await status(http) == (503, {"state": "running"})


def test_without_sleep_mode_there_are_no_checkpoint_routes():
    plain = fleet_doc({"time_scale": 1.0}, [POD])
    with ServerProcess(plain) as s:
        assert httpx.get(f"{s.http_url}/checkpoint/status").status_code == 404
        assert httpx.post(f"{s.http_url}/checkpoint/prepare").status_code == 404


def test_prepare_on_startup_starts_prepared_and_needs_sleep_mode():
    with ServerProcess(doc(checkpoint_prepare_on_startup=True)) as s:
        r = httpx.get(f"{s.http_url}/checkpoint/status")
        assert r.status_code == 200 and r.json() == {"state": "prepared"}
        r = httpx.post(f"{s.http_url}/v1/completions", json=body(2), timeout=30)
        assert r.status_code == 503
        assert httpx.post(f"{s.http_url}/checkpoint/restore").json() == {"state": "running"}
        r = httpx.post(f"{s.http_url}/v1/completions",
                       json={**body(2), "prompt": PROMPT[:10]}, timeout=30)
        assert r.status_code == 200
    out = subprocess.run(
        [sys.executable, "-m", "doppelchip.cli", "vllm", "serve", "meta-llama/Llama-3.1-8B",
         "--checkpoint-prepare-on-startup", "--port", "0", "--grpc-port", "0"], cwd=ROOT,
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "checkpoint_prepare_on_startup requires enable_sleep_mode" in out.stderr
