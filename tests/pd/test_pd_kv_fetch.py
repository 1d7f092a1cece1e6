"""A decode pod's requests whose KV is on its way, as vLLM 0.33.0's scheduler counts them: in
`vllm:num_requests_waiting` (its waiting queue holds them), `deferred` once the load has started
(`vllm:num_requests_waiting_by_reason`), and by stage in `vllm:num_requests_kv_fetch_by_stage`
— `waiting_to_start` while the prefill side has not answered, `in_progress` while the KV
crosses the link. A client that goes away releases the request: every gauge falls back to 0
and the prefill side is told to free its blocks.

As in vLLM, a full decode pod starts no pull: the KV stays on the prefill pod until a seat
frees. The test plays the prefill pod's side channel itself (a ZeroMQ ROUTER, as vLLM's
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


def decode_pod(*extra: str, env: dict[str, str] | None = None) -> ServerProcess:
    """A decode pod with one seat, 100× slower than real time."""
    return ServerProcess(None, "--deployment", "decode", "--chip", CHIP, "--engine", "vllm",
                         "--model", MODEL, "--quant", "bf16", "--time-scale", "100",
                         "--max-num-seqs", "1", "--kv-transfer-config", config("kv_both"),
                         *extra, env={"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_run(1)),
                                      **(env or {})})


@pytest.fixture(scope="module")
def decode():
    with decode_pod() as pod:
        yield pod


class PrefillSide:
    """The prefill pod's side channel, played by the test (a ROUTER, as vLLM's
    `_nixl_handshake_listener`): it answers when the test says so."""

    def __init__(self, engine_id: str) -> None:
        self.engine_id = engine_id  # each side a prefill engine of its own: one handshake
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")

    def body(self, rid: str, prompt: list[int] = PROMPT) -> dict:
        """A decode request as llm-d's sidecar sends it, for blocks this side holds."""
        params = {"do_remote_prefill": True, "do_remote_decode": False,
                  "remote_block_ids": list(range(250)), "remote_engine_id": self.engine_id,
                  "remote_request_id": rid, "remote_host": "127.0.0.1",
                  "remote_port": self.port, "tp_size": 1}
        return {"model": MODEL, "prompt": prompt, "max_tokens": 8, "stream": True,
                "kv_transfer_params": params}

    async def recv(self) -> tuple[bytes, list]:
        ident, _, raw = await asyncio.wait_for(self.sock.recv_multipart(), 30)
        return ident, dec.decode(raw)

    async def asked(self, rid: str) -> tuple[bytes, str]:
        """The decode pod's handshake and its read of `rid`'s blocks: (its id, its key)."""
        (ident, meta), (_, read) = [await self.recv() for _ in range(2)]
        assert meta[0] == GET_META_MSG and read[:2] == ["read", rid]
        return ident, read[2]

    async def answer(self, ident: bytes, key: str) -> None:
        p = place(DeploymentSpec(model=MODEL, quant="bf16", chip=CHIP, engine="vllm"))
        mine = SimpleNamespace(model=MODEL, quant="bf16", kv_bytes_per_token=p.kv_bytes_per_token)
        await self.sock.send_multipart((ident, b"", enc.encode(["meta", {
            "engine_id": self.engine_id, "chip": CHIP, "chips": 1, "tp_size": 1,
            "block_size": 16, "compatibility": compatibility(mine)}])))
        await self.sock.send_multipart((ident, b"", enc.encode(["read_ok", key])))

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


async def stream(pod: ServerProcess, body: dict) -> None:
    async with httpx.AsyncClient(timeout=120) as http, \
            http.stream("POST", f"{pod.http_url}/v1/completions", json=body) as r:
        async for _ in r.aiter_lines():
            pass


async def gone(*clients: asyncio.Task) -> None:
    """The clients go away (their streams closed mid-response)."""
    for client in clients:
        client.cancel()
    await asyncio.gather(*clients, return_exceptions=True)


ZERO = dict.fromkeys((*STAGES, "waiting", "capacity", "deferred"), 0)


async def test_a_pull_is_waiting_then_in_progress_then_released_when_the_client_goes(decode):
    side = PrefillSide("prefill-0")
    assert gauges(decode.scrape()) == ZERO
    try:
        client = asyncio.create_task(stream(decode, side.body("cmpl-p-0")))
        try:
            ident, key = await side.asked("cmpl-p-0")
            # not answered yet: the load has not started; the request waits for capacity
            await until(decode, {"waiting_to_start": 1, "in_progress": 0, "waiting": 1,
                                 "capacity": 1, "deferred": 0})
            await side.answer(ident, key)
            # answered, and the seat is free: the KV crosses the link, the request deferred
            await until(decode, {"waiting_to_start": 0, "in_progress": 1, "waiting": 1,
                                 "capacity": 0, "deferred": 1})
        finally:
            await gone(client)  # the client goes away mid-transfer
        assert (await side.recv())[1] == ["notif", "cmpl-p-0:1"]  # free your blocks
        await until(decode, ZERO)
    finally:
        side.close()


async def test_a_full_decode_pod_starts_the_pull_only_when_a_seat_frees(decode):
    """vLLM's scheduler starts a remote prefill's load when it admits the request: while the
    one seat is taken the KV stays on the prefill pod (no notification frees it there)."""
    side = PrefillSide("prefill-1")
    busy_body = {"model": MODEL, "prompt": PROMPT[:64], "max_tokens": 4000,
                 "ignore_eos": True, "stream": True}
    try:
        busy = asyncio.create_task(stream(decode, busy_body))
        client = asyncio.create_task(stream(decode, side.body("cmpl-p-1")))
        try:
            ident, key = await side.asked("cmpl-p-1")
            deadline = time.monotonic() + 30
            while metric(await asyncio.to_thread(decode.scrape),
                         "vllm:num_requests_running") != 1:
                assert time.monotonic() < deadline, "the busy request never ran"
                await asyncio.sleep(0.02)
            await side.answer(ident, key)
            await until(decode, {"waiting_to_start": 1, "in_progress": 0, "waiting": 1,
                                 "capacity": 1, "deferred": 0})
            assert not await side.sock.poll(0)  # nothing read, nothing freed
            await gone(busy)  # the seat frees: the pull starts
            await until(decode, {"waiting_to_start": 0, "in_progress": 1, "deferred": 1})
        finally:
            await gone(busy, client)
        assert (await side.recv())[1] == ["notif", "cmpl-p-1:1"]
        await until(decode, ZERO)
    finally:
        side.close()


async def test_a_request_held_back_while_asleep_still_lets_the_prefill_pod_go():
    """Answered while the pod sleeps, the request waits for the wake-up outside the
    scheduler; a client that leaves then is released like any other, the prefill side told."""
    side = PrefillSide("prefill-2")
    try:
        with decode_pod("--enable-sleep-mode", env={"VLLM_SERVER_DEV_MODE": "1"}) as pod:
            async with httpx.AsyncClient(base_url=pod.http_url, timeout=60) as http:
                assert (await http.post("/sleep?level=1")).status_code == 200
            client = asyncio.create_task(stream(pod, side.body("cmpl-p-2")))
            try:
                ident, key = await side.asked("cmpl-p-2")
                await side.answer(ident, key)
                await until(pod, {"waiting": 1})
            finally:
                await gone(client)
            assert (await side.recv())[1] == ["notif", "cmpl-p-2:1"]
            await until(pod, ZERO)
    finally:
        side.close()


async def test_a_one_token_prompt_pulls_nothing_and_lets_the_prefill_pod_go(decode):
    """All but the last prompt token would be pulled: of a one-token prompt, nothing. The
    prefill side is told at once, before the request has even run."""
    side = PrefillSide("prefill-3")
    try:
        client = asyncio.create_task(stream(decode, side.body("cmpl-p-3", PROMPT[:1])))
        try:
            ident, key = await side.asked("cmpl-p-3")
            await side.answer(ident, key)
            assert (await side.recv())[1] == ["notif", "cmpl-p-3:1"]
        finally:
            await gone(client)
        await until(decode, ZERO)
    finally:
        side.close()


def test_a_prefill_only_pod_has_no_fetch_gauge():
    """vLLM registers the family only where the connector's role consumes KV."""
    with ServerProcess(None, "--deployment", "prefill", "--chip", CHIP, "--engine", "vllm",
                       "--model", MODEL, "--quant", "bf16",
                       "--kv-transfer-config", config("kv_producer"),
                       env={"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_run(1))}) as pod:
        text = pod.scrape()
    assert "vllm:num_requests_waiting{" in text
    assert "vllm:num_requests_kv_fetch_by_stage" not in text
