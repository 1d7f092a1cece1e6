"""vLLM 0.34.0's fault tolerance on a pod (`--enable-fault-tolerance`; server/engine_proc/
sentinel.py, server/frontend/fault_tolerance.py, server/http/fault_tolerance.py): an injected
engine crash aborts the requests in flight and the engine waits, unhealthy, for an
orchestrator's instruction instead of dying; new requests get vLLM's 503 meanwhile while
/health stays 200; `POST /v1/fault_tolerance/apply` answers 202 and its outcome shows in
`GET /v1/fault_tolerance/status` (a refusal: `ft_state` "failed" with vLLM's reason; a
recovery: the engine's push replaces the entry); with no instruction in time the engine dies
and the supervisor restarts it. Times are emulated seconds since the server started
(time_scale 0.05: 20 per wall second); the crash comes after the engine is ready (read from
its log; a host too slow to start it by then skips the module rather than test nothing)."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest
from server_proc import ServerProcess, metric

CRASH_AT = 120.0  # emulated s: ~5 wall s after a warm pod is ready (t≈13)
POD = ("--deployment", "vllm-h100", "--time-scale", "0.05", "--engine-restart-backoff", "0.2",
       "--enable-fault-tolerance", "--fault-crash", f"at={CRASH_AT}")
FAULTED = ("The engine has faulted and cannot accept new requests. Please try again later or "
           "on a different instance.")
PROMPT = {"model": "llama-3.1-8b", "prompt": "Tell me", "ignore_eos": True}


def armed_in_time(server: ServerProcess) -> None:
    line = server.wait_for_log(r"fault injection: vllm-h100 armed at t=")
    armed = float(re.search(r"armed at t=([\d.]+)", line).group(1))
    if armed >= CRASH_AT - 40:
        pytest.skip(f"host too slow: the engine was ready only at t={armed} (emulated)")


@pytest.fixture(scope="module")
def pod():
    with ServerProcess(None, *POD, "--fault-tolerance-config",
                       json.dumps({"engine_recovery_timeout_sec": 1_000_000})) as s:
        armed_in_time(s)
        yield s


async def status_until(http: httpx.AsyncClient, predicate, timeout: float = 30.0) -> dict:
    """The engine's status entry once `predicate(entry)` holds (an observable condition,
    polled: the instruction runs in the background, as vLLM's)."""
    deadline = time.monotonic() + timeout
    while True:
        body = (await http.get("/v1/fault_tolerance/status")).json()
        assert (body["schema_version"], body["total_engines"]) == (1, 1)
        (entry,) = body["engines"]
        if predicate(entry):
            return entry
        assert time.monotonic() < deadline, f"condition not met: {entry}"
        await asyncio.sleep(0.02)


async def apply(http: httpx.AsyncClient, instruction: str, request_id: str, **params) -> None:
    r = await http.post("/v1/fault_tolerance/apply", json={
        "instruction": instruction, "params": params, "request_id": request_id})
    assert r.status_code == 202
    assert r.json() == {"message": "Request accepted; poll /v1/fault_tolerance/status for "
                                   "updates.", "request_id": request_id}


async def stream(http: httpx.AsyncClient, max_tokens: int) -> tuple[int, str | None, int]:
    """(chunks with text, the last finish_reason, HTTP status) of one streamed completion."""
    async with http.stream("POST", "/v1/completions", json={
            **PROMPT, "max_tokens": max_tokens, "stream": True}) as r:
        if r.status_code != 200:
            await r.aread()
            return 0, None, r.status_code
        chunks, reason = 0, None
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            chunks += bool(choice["text"])
            reason = choice["finish_reason"] or reason
    return chunks, reason, 200


async def test_a_fault_aborts_the_requests_and_waits_for_a_recovery(pod):
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=30) as http:
        assert await status_until(http, lambda e: True) == {"id": 0, "status": "healthy"}
        # an instruction while healthy: accepted (202), refused by the engine, as vLLM's
        await apply(http, "retry", "round-0")
        failed = await status_until(http, lambda e: e.get("ft_state") == "failed")
        assert failed == {"id": 0, "status": "healthy", "ft_state": "failed",
                          "last_ft_request_id": "round-0",
                          "ft_error": "[FT] Rejecting retry on engine 0: status is HEALTHY"}

        text = (await http.get("/metrics")).text  # the test starts before the crash
        assert metric(text, "doppelchip_fault_events_total", fault="crash") == 0
        ended: list[tuple[int, str | None, int]] = []

        async def worker(n: int) -> None:
            """Long streams back to back until one is cut or refused: each lasts ~20 emulated
            seconds and the gap between two ~1, so at the crash one of the two workers (of
            unlike lengths) is mid-stream."""
            for _ in range(100):
                result = await stream(http, n)
                if result[1] != "length":
                    ended.append(result)
                    return
            raise AssertionError("the crash never came")

        await asyncio.gather(worker(2900), worker(3700))
        # the requests in flight were aborted (vLLM's sentinel finishes them FINISHED_ABORTED)
        assert any(chunks > 0 and reason == "abort" for chunks, reason, _ in ended), ended
        assert all(reason == "abort" or code == 503 for _, reason, code in ended), ended
        # the fault's push replaced the entry (the earlier refusal's decoration went with it)
        assert await status_until(http, lambda e: True) == {
            "id": 0, "status": "unhealthy", "fault_info": "RuntimeError"}
        refused = await http.post("/v1/completions", json={**PROMPT, "max_tokens": 4})
        assert refused.status_code == 503 and refused.json()["error"]["message"] == FAULTED
        assert (await http.get("/health")).status_code == 200  # vLLM's: not dead, waiting
        # scale_down needs data parallelism: refused, still unhealthy
        await apply(http, "scale_down", "round-1", removed_dp_ranks=[1])
        failed = await status_until(http, lambda e: e.get("ft_state") == "failed")
        assert failed["status"] == "unhealthy" and failed["last_ft_request_id"] == "round-1"
        assert failed["ft_error"] == ("scale_down requires data_parallel_size > 1; a dp=1 "
                                      "engine has no ranks to remove")
        # retry recovers: the engine's push replaces the entry
        await apply(http, "retry", "round-2")
        assert await status_until(http, lambda e: e["status"] == "healthy") == {
            "id": 0, "status": "healthy"}
        served = await http.post("/v1/completions", json={**PROMPT, "max_tokens": 4})
        assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 4
        text = (await http.get("/metrics")).text
    # nothing held: the aborted requests released their KV blocks and seats
    assert metric(text, "vllm:num_requests_running") == 0
    assert metric(text, "vllm:kv_cache_usage_perc") == 0
    assert metric(text, "vllm:request_success_total", finished_reason="abort") >= 1


@pytest.mark.parametrize("body, says", [
    ("[1]", "Request body must be a JSON object."),
    ("{}", "'instruction' is required."),
    ('{"instruction": "reboot", "request_id": "x"}', "Invalid instruction: 'reboot'."),
    ('{"instruction": "retry", "params": [], "request_id": "x"}', "'params' must be an object."),
    ('{"instruction": "retry"}', "'request_id' must be a non-empty string."),
    ("{nope", "Invalid JSON format"),
])
async def test_apply_refuses_what_vllm_refuses(pod, body, says):
    async with httpx.AsyncClient(base_url=pod.http_url, timeout=30) as http:
        r = await http.post("/v1/fault_tolerance/apply", content=body,
                            headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["message"] == says
        r = await http.post("/v1/fault_tolerance/apply", content="{}",
                            headers={"content-type": "text/plain"})
        assert r.status_code == 400 and "Unsupported Media Type" in r.json()["error"]["message"]


async def test_without_an_instruction_in_time_the_engine_dies_and_restarts():
    key = "ft-secret"
    with ServerProcess(None, *POD, "--api-key", key, "--fault-tolerance-config",
                       json.dumps({"engine_recovery_timeout_sec": 30})) as s:
        armed_in_time(s)
        s.wait_for_log(r"\[FT\] Busy loop raised RuntimeError", timeout=60)
        s.wait_for_log(r"\[FT\] No recovery within 30s timeout", timeout=60)
        s.wait_for_log(r"engine process exited \(exit status 70\)", timeout=60)
        async with httpx.AsyncClient(base_url=s.http_url, timeout=30,
                                     headers={"Authorization": f"Bearer {key}"}) as http:
            assert (await httpx.AsyncClient(base_url=s.http_url).get(
                "/v1/fault_tolerance/status")).status_code == 401  # behind the API key
            deadline = time.monotonic() + 60
            while (r := await http.post("/v1/completions",
                                        json={**PROMPT, "max_tokens": 4})).status_code != 200:
                assert time.monotonic() < deadline, r.text  # the restart's cold start
                await asyncio.sleep(0.05)
            assert await status_until(http, lambda e: True) == {"id": 0, "status": "healthy"}
