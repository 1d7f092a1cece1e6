"""Sleep mode over HTTP on a real pod, as vLLM 0.33.0 serves it: the routes and their answers,
vllm:engine_sleep_state as vLLM sets it, the KV cache freed, a request sent while asleep queued
until the wake-up, the wake-up's emulated cost — weights per chip over the host link (level 1)
or from storage (level 2), computed here from the catalogue — and the sleep-mode operation
metrics, in emulated seconds. A wake-up that leaves nothing asleep resumes a paused engine, and
`/is_sleeping` is true while `/pause` holds, as vLLM 0.33.0's."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from server_proc import ServerProcess, metric

from devices import DeploymentSpec, catalog, place

MODEL, CHIP = "llama-3.1-8b", "h100-sxm"
POD = ["--deployment", "pod", "--chip", CHIP, "--engine", "vllm", "--model", MODEL,
       "--quant", "bf16", "--time-scale", "0.05", "--enable-sleep-mode"]
PROMPT = [(11 * i) % 3000 + 50 for i in range(256)]


def weight_bytes_per_chip() -> float:
    p = place(DeploymentSpec(model=MODEL, quant="bf16", chip=CHIP, engine="vllm"))
    return sum(b for _, b in p.weight_bytes) / p.chips


def states(text: str) -> dict[str, float]:
    return {s: metric(text, "vllm:engine_sleep_state", sleep_state=s)
            for s in ("awake", "weights_offloaded", "discard_all")}


@pytest.fixture(scope="module")
def server():
    with ServerProcess(None, *POD, env={"VLLM_SERVER_DEV_MODE": "1"}) as s:  # for /pause
        yield s


def operations(text: str, name: str, operation: str) -> float:
    """A sleep-mode series' value (0 before the first operation creates the family)."""
    if f'{name}{{operation="{operation}"}}' not in text:
        return 0.0
    return metric(text, name, operation=operation)


async def until_waiting(server: ServerProcess, n: int) -> None:
    for _ in range(500):
        if metric(server.scrape(), "vllm:num_requests_waiting") == n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the request was not queued")


@pytest.mark.parametrize("level", [1, 2])
async def test_sleep_wake_round_trip(server, level):
    chip = catalog.get_chip(CHIP)
    bandwidth = (chip.host_link_bw_bps if level == 1
                 else min(catalog.get_chip("nvme-gen4").tier.bandwidth_bps,
                          chip.host_link_bw_bps))
    wake = weight_bytes_per_chip() / bandwidth
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": False}
        assert (await http.post("/v1/completions", json=body)).status_code == 200
        assert states(server.scrape()) == {"awake": 1, "weights_offloaded": 0,
                                           "discard_all": 0}
        text = server.scrape()
        wake_sum = operations(text, "vllm:sleep_mode_operation_duration_seconds_sum", "wake")
        sleeps = operations(text, "vllm:sleep_mode_operation_duration_seconds_count", "sleep")
        r = await http.post(f"/sleep?level={level}")
        assert r.status_code == 200 and r.json() == {"status": "sleeping", "level": level}
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": True}
        text = server.scrape()
        assert states(text) == {"awake": 0, "weights_offloaded": float(level == 1),
                                "discard_all": float(level == 2)}
        assert metric(text, "vllm:kv_cache_usage_perc") == 0  # the KV cache is freed
        hits = metric(text, "vllm:prefix_cache_hits_total")
        ttft_sum = metric(text, "vllm:time_to_first_token_seconds_sum")
        woke = metric(text, "doppelchip_wake_seconds_total")
        # a request sent while asleep is accepted and waits for the wake-up (vLLM's PAUSED_NEW)
        pending = asyncio.create_task(http.post("/v1/completions", json=body))
        await until_waiting(server, 1)
        assert not pending.done()
        r = await http.post("/wake_up")
        assert r.status_code == 200 and r.json() == {"status": "awake", "tags": None}
        r = await pending
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": False}
    text = server.scrape()
    assert states(text)["awake"] == 1
    assert metric(text, "doppelchip_wake_seconds_total") - woke == pytest.approx(wake)
    # its TTFT includes bringing the weights back; the prefix cache was reset by the sleep
    assert metric(text, "vllm:time_to_first_token_seconds_sum") - ttft_sum >= wake
    assert metric(text, "vllm:prefix_cache_hits_total") == hits
    # vLLM's sleep-mode operation series: the wake-up lasted its emulated weight transfer
    duration = "vllm:sleep_mode_operation_duration_seconds"
    assert operations(text, f"{duration}_count", "sleep") == sleeps + 1
    assert operations(text, f"{duration}_sum", "wake") - wake_sum >= wake
    assert all(operations(text, "vllm:sleep_mode_operations_in_flight", op) == 0
               for op in ("sleep", "wake"))


async def test_sleep_aborts_in_flight_requests_and_refuses_bad_levels(server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
        assert (await http.post("/sleep?level=3")).status_code == 400
        assert (await http.post("/sleep?level=1&mode=nap")).status_code == 400
        assert (await http.post("/wake_up?tags=brain")).status_code == 400
        running = asyncio.create_task(http.post("/v1/completions", json=body))
        for _ in range(500):
            if metric(server.scrape(), "vllm:num_requests_running") == 1:
                break
            await asyncio.sleep(0.01)
        assert (await http.post("/sleep?level=1")).status_code == 200  # mode abort
        r = await running
        assert r.json()["choices"][0]["finish_reason"] == "abort"
        # waking the weights only: still asleep until the KV cache is back too (vLLM's tags)
        r = await http.post("/wake_up?tags=weights")
        assert r.json() == {"status": "sleeping", "tags": ["weights"]}
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": True}
        r = await http.post("/wake_up?tags=kv_cache")
        assert r.json() == {"status": "awake", "tags": ["kv_cache"]}
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": False}


async def test_a_paused_engine_is_sleeping_until_a_wake_up_resumes_it(server):
    """vLLM 0.33.0: `is_sleeping` is `is_scheduler_paused() or executor sleeping`, and a wake-up
    that leaves nothing asleep resumes the scheduler, a `/pause` too."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
        assert (await http.post("/pause?mode=abort")).status_code == 200
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": True}
        assert (await http.post("/v1/completions", json=body)).status_code == 503
        r = await http.post("/wake_up")
        assert r.json() == {"status": "awake", "tags": None}
        assert (await http.get("/is_paused")).json() == {"is_paused": False}
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": False}
        assert (await http.post("/v1/completions", json=body)).status_code == 200


async def test_release_kv_cache_memory_after_a_completed_pause(server):
    """vLLM 0.33.0's /release_kv_cache_memory: refused (500, the engine's RuntimeError) unless
    a pause is complete and all memory resident; then the prefix cache is gone and the KV
    cache sleeps until a wake-up, which also resumes the pause."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "ignore_eos": True}
    failed = "Call to release_kv_cache_memory method failed: release_kv_cache_memory() requires"
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
        assert (await http.post("/v1/completions", json=body)).status_code == 200  # cached
        r = await http.post("/release_kv_cache_memory")
        assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
        assert r.json()["error"]["message"] == f"{failed} a completed pause first"
        assert (await http.post("/pause?mode=abort")).status_code == 200
        r = await http.post("/release_kv_cache_memory")
        assert r.status_code == 200 and r.json() == {"status": "kv_cache_released"}
        text = server.scrape()
        assert states(text) == {"awake": 0, "weights_offloaded": 0, "discard_all": 0}
        assert operations(text, "vllm:sleep_mode_operation_duration_seconds_count",
                          "release_kv_cache_memory") == 2  # the refused call counts too
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": True}
        r = await http.post("/release_kv_cache_memory")
        assert r.json()["error"]["message"] == (f"{failed} all executor memory to be "
                                                "resident")
        r = await http.post("/wake_up?tags=kv_cache")
        assert r.json() == {"status": "awake", "tags": ["kv_cache"]}
        assert (await http.get("/is_paused")).json() == {"is_paused": False}
        r = await http.post("/v1/completions", json=body)
        assert r.status_code == 200  # its prefix was released with the KV cache
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert states(server.scrape())["awake"] == 1


async def test_reset_prefix_cache_can_preempt_the_running_requests(server):
    """vLLM's ?reset_running_requests=true: the running request is preempted (it recomputes
    and still finishes) so that the reset succeeds; without it the reset is refused."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3000, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
        preemptions = metric(server.scrape(), "vllm:num_preemptions_total")
        running = asyncio.create_task(http.post("/v1/completions", json=body))
        for _ in range(500):
            if metric(server.scrape(), "vllm:num_requests_running") == 1:
                break
            await asyncio.sleep(0.01)
        assert (await http.post("/reset_prefix_cache")).json() == {"success": False}
        r = await http.post("/reset_prefix_cache?reset_running_requests=true&reset_external=1")
        assert r.json() == {"success": True}
        assert not running.done()
        r = await running
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["usage"]["completion_tokens"] == 3000
    assert metric(server.scrape(), "vllm:num_preemptions_total") == preemptions + 1
