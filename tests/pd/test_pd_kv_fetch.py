"""A decode pod's requests whose KV is on its way, as vLLM 0.33.0's scheduler counts them: in
`vllm:num_requests_waiting` (its waiting queue holds them), `deferred` once the load has started
(`vllm:num_requests_waiting_by_reason`), and by stage in `vllm:num_requests_kv_fetch_by_stage`
— `waiting_to_start` while the prefill side has not answered, `in_progress` while the KV
crosses the link. A client that goes away releases the request: every gauge falls back to 0
and the prefill side is told to free its blocks.

The test plays the prefill pod's side channel itself (a ZeroMQ ROUTER, as vLLM's
`_nixl_handshake_listener`), so it decides when the handshake is answered; the decode pod runs
100× slower than real time, so the transfer (0.4 emulated seconds over a 10 GbE link) lasts
about 40 wall seconds, and the test never waits for it to end."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import httpx
import msgspec
import pytest
import zmq
import zmq.asyncio
from server_proc import ServerProcess, free_run, metric

from devices import DeploymentSpec, place
from server.engine_proc.kv_connector import GET_META_MSG, compatibility

MODEL, CHIP = "llama-3.1-8b", "h100-sxm"
PROMPT = [(13 * i) % 5000 + 100 for i in range(4000)]
STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()


def config(role: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role,
                       "kv_connector_extra_config": {"link": "eth-10g"}})


def gauges(text: str) -> dict[str, float]:
    found = {s: metric(text, "vllm:num_requests_kv_fetch_by_stage", stage=s) for s in STAGES}
    found["waiting"] = metric(text, "vllm:num_requests_waiting")
    for reason in ("capacity", "deferred"):
        found[reason] = metric(text, "vllm:num_requests_waiting_by_reason", reason=reason)
    return found


async def until(pod: ServerProcess, want: dict[str, float]) -> dict[str, float]:
    """The pod's gauges once they show `want` (fails after 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        seen = gauges(await asyncio.to_thread(pod.scrape))
        if all(seen[k] == v for k, v in want.items()):
            return seen
        assert time.monotonic() < deadline, f"never {want}: {seen}"
        await asyncio.sleep(0.02)


@pytest.fixture(scope="module")
def decode():
    port = free_run(1)
    with ServerProcess(None, "--deployment", "decode", "--chip", CHIP, "--engine", "vllm",
                       "--model", MODEL, "--quant", "bf16", "--time-scale", "100",
                       "--kv-transfer-config", config("kv_both"),
                       env={"VLLM_NIXL_SIDE_CHANNEL_PORT": str(port)}) as pod:
        yield pod


async def test_a_pull_is_waiting_then_in_progress_then_released_when_the_client_goes(decode):
    ctx = zmq.asyncio.Context()
    side = ctx.socket(zmq.ROUTER)  # the prefill pod's side channel
    side.setsockopt(zmq.LINGER, 0)
    port = side.bind_to_random_port("tcp://127.0.0.1")
    params = {"do_remote_prefill": True, "do_remote_decode": False,
              "remote_block_ids": list(range(250)), "remote_engine_id": "prefill-0",
              "remote_request_id": "cmpl-p-0", "remote_host": "127.0.0.1",
              "remote_port": port, "tp_size": 1}
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "stream": True,
            "kv_transfer_params": params}

    async def stream() -> None:
        async with httpx.AsyncClient(timeout=120) as http, \
                http.stream("POST", f"{decode.http_url}/v1/completions", json=body) as r:
            async for _ in r.aiter_lines():
                pass

    assert gauges(decode.scrape()) == dict.fromkeys((*STAGES, "waiting", "capacity",
                                                     "deferred"), 0)
    try:
        client = asyncio.create_task(stream())
        try:
            asked = []
            while len(asked) < 2:  # the handshake, then the read of the held blocks
                ident, _, raw = await asyncio.wait_for(side.recv_multipart(), 30)
                asked.append((ident, dec.decode(raw)))
            (ident, meta), (_, read) = asked
            assert meta[0] == GET_META_MSG and read[:2] == ["read", "cmpl-p-0"]
            # not answered yet: the load has not started; the request waits for capacity
            await until(decode, {"waiting_to_start": 1, "in_progress": 0, "waiting": 1,
                                 "capacity": 1, "deferred": 0})
            p = place(DeploymentSpec(model=MODEL, quant="bf16", chip=CHIP, engine="vllm"))
            mine = SimpleNamespace(model=MODEL, quant="bf16",
                                   kv_bytes_per_token=p.kv_bytes_per_token)
            await side.send_multipart((ident, b"", enc.encode(["meta", {
                "engine_id": "prefill-0", "chip": CHIP, "chips": 1, "tp_size": 1,
                "block_size": 16, "compatibility": compatibility(mine)}])))
            await side.send_multipart((ident, b"", enc.encode(["read_ok", read[2]])))
            # answered: the KV crosses the link; the request is deferred (vLLM's skip_request)
            await until(decode, {"waiting_to_start": 0, "in_progress": 1, "waiting": 1,
                                 "capacity": 0, "deferred": 1})
        finally:
            client.cancel()  # the client goes away mid-transfer
            await asyncio.gather(client, return_exceptions=True)
        _, _, raw = await asyncio.wait_for(side.recv_multipart(), 30)
        assert dec.decode(raw) == ["notif", "cmpl-p-0:1"]  # free your blocks, as vLLM's
        await until(decode, dict.fromkeys((*STAGES, "waiting", "capacity", "deferred"), 0))
    finally:
        side.close(linger=0)
        ctx.term()


def test_a_prefill_only_pod_has_no_fetch_gauge():
    """vLLM registers the family only where the connector's role consumes KV."""
    with ServerProcess(None, "--deployment", "prefill", "--chip", CHIP, "--engine", "vllm",
                       "--model", MODEL, "--quant", "bf16",
                       "--kv-transfer-config", config("kv_producer"),
                       env={"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_run(1))}) as pod:
        text = pod.scrape()
    assert "vllm:num_requests_waiting{" in text
    assert "vllm:num_requests_kv_fetch_by_stage" not in text
