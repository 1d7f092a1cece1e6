"""Running fuzz cases against one real server: a background event loop holding the clients
(grpc.aio channels and an httpx client belong to the loop that made them), and one coroutine
per case that returns what the server answered.

Hypothesis drives plain (synchronous) test functions; each example is a batch of cases run
concurrently on this loop, so thousands of cases take seconds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import grpc
import httpx
from documented import INFERENCE, VLLM_ENGINE, allowed_grpc, allowed_http
from fuzz_strategies import ID_POOL, Case
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from server_proc import ServerProcess, released
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc

from clients.client import AsyncClient
from doppelchip.v1 import inference_pb2_grpc as pb_grpc

READ_TIMEOUT = 30.0  # a read case that takes this long is stuck: a failure
DEADLINE = 0.05


class LoopThread:
    """An asyncio loop in a daemon thread; `run(coro)` blocks until it is done."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 300) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Clients:
    """One channel (one connection) for the gRPC cases and one httpx client, made on the
    loop that uses them."""

    def __init__(self, target: str, http_url: str) -> None:
        options = [("grpc.max_send_message_length", -1),
                   ("grpc.max_receive_message_length", 64 * 2**20)]
        self.channel = grpc.aio.insecure_channel(target, options=options)
        self.inference = pb_grpc.InferenceStub(self.channel)
        self.vllm = vpb_grpc.VllmEngineStub(self.channel)
        self.http = httpx.AsyncClient(base_url=http_url, timeout=READ_TIMEOUT)

    async def close(self) -> None:
        await self.http.aclose()
        await self.channel.close()


async def _finish(call, action: str) -> None:
    """Read a streaming call as `action` says (its status raises as AioRpcError)."""
    async for _ in call:
        if action == "cancel":
            call.cancel()
            break
    if action == "cancel":
        await asyncio.sleep(0)  # the cancel reaches the transport
        code = await call.code()
        if code is not grpc.StatusCode.CANCELLED and code is not grpc.StatusCode.OK:
            raise grpc.aio.AioRpcError(code, None, None, await call.details())


def _timeout(action: str) -> float:
    return DEADLINE if action == "deadline" else READ_TIMEOUT


async def run_case(c: Clients, case: Case) -> tuple[Any, frozenset]:
    """(what came back, what may come back) for one case."""
    try:
        if case.kind == "http":
            return await _http(c, case), allowed_http()
        allowed = allowed_grpc(VLLM_ENGINE if "VllmEngine" in _method(case) else INFERENCE,
                               case.action)
        timeout = _timeout(case.action)
        if case.kind == "inference":
            await _finish(c.inference.Generate(case.payload, timeout=timeout), case.action)
        elif case.kind == "vllm":
            await _finish(c.vllm.Generate(case.payload, timeout=timeout), case.action)
        elif case.kind in ("raw", "stream_other"):
            method, data = case.payload
            await _finish(c.channel.unary_stream(method)(data, timeout=timeout), case.action)
        elif case.kind == "unary":
            method, data = case.payload
            await c.channel.unary_unary(method)(data, timeout=READ_TIMEOUT)
        elif case.kind == "abort":
            await c.vllm.Abort(vpb.AbortRequest(request_ids=case.payload), timeout=READ_TIMEOUT)
        return grpc.StatusCode.OK, allowed
    except grpc.aio.AioRpcError as e:
        return (e.code(), e.details()), allowed


def _method(case: Case) -> str:
    if case.kind in ("raw", "unary", "stream_other"):
        return case.payload[0]
    return "VllmEngine" if case.kind in ("vllm", "abort") else "Inference"


async def _http(c: Clients, case: Case) -> Any:
    method, path, body, headers = case.payload
    if case.action == "cancel":  # leave after the first bytes of the answer
        async with c.http.stream(method, path, content=body, headers={
                "Content-Type": "application/json", **headers}) as r:
            async for _ in r.aiter_bytes():
                break
            return r.status_code
    r = await c.http.request(method, path, content=body,
                             headers={"Content-Type": "application/json", **headers})
    return r.status_code


def status_of(answer: Any) -> Any:
    """The status alone (a gRPC answer carries its details too)."""
    return answer[0] if isinstance(answer, tuple) else answer


async def run_batch(c: Clients, cases: list[Case]) -> list[tuple[Case, Any]]:
    """Every case at once; the ones whose answer is not allowed."""
    results = await asyncio.gather(*(run_case(c, k) for k in cases))
    return [(k, answer) for k, (answer, allowed) in zip(cases, results, strict=True)
            if status_of(answer) not in allowed]


def run_batches(loop: LoopThread, run: Callable[[list[Case]], Coroutine[Any, Any, list]],
                cases: st.SearchStrategy[Case], examples: int, size: int) -> int:
    """Hypothesis draws `examples` batches of `size` cases (derandomized: CI is
    deterministic); each batch runs concurrently on `loop` (`run(batch)`: the cases whose
    answer was not allowed, each with it), and a batch with any fails listing them. The
    number of cases run."""
    seen: list[int] = []

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              phases=(Phase.explicit, Phase.generate),
              suppress_health_check=list(HealthCheck))
    @given(st.lists(cases, min_size=size, max_size=size))
    def batch(drawn: list[Case]) -> None:
        bad = loop.run(run(drawn))
        seen.append(len(drawn))
        assert not bad, "undocumented answers:\n" + "\n".join(
            f"{answer!r:.300} <- {k!r}" for k, answer in bad)

    batch()
    return sum(seen)


# --- an engine service's fuzzer (SGLang's, TensorRT-LLM's): one stub, raw calls, HTTP ----------
async def run_service_case(stub: Any, channel: grpc.aio.Channel, case: Case, service: frozenset,
                           abort: Callable[[str], Any],
                           other: Callable[[Any, Case], Coroutine[Any, Any, Any]] | None = None
                           ) -> tuple[Any, frozenset]:
    """(what came back, what may come back) for one gRPC case of an engine service: a
    `generate` (its request), `raw` (method and bytes to a streaming method), `unary` (method
    and bytes), `abort` (an id: `abort(rid)` is the AbortRequest), or any other kind
    (`other(stub, case)`). A call the client cancelled ends OK."""
    allowed = allowed_grpc(service, case.action)
    try:
        if case.kind == "generate":
            await _finish(stub.Generate(case.payload, timeout=_timeout(case.action)),
                          case.action)
        elif case.kind == "raw":
            method, data = case.payload
            await _finish(channel.unary_stream(method)(data, timeout=_timeout(case.action)),
                          case.action)
        elif case.kind == "unary":
            method, data = case.payload
            await channel.unary_unary(method)(data, timeout=READ_TIMEOUT)
        elif case.kind == "abort":
            await stub.Abort(abort(case.payload), timeout=READ_TIMEOUT)
        else:
            assert other is not None, case.kind
            await other(stub, case)
        return grpc.StatusCode.OK, allowed
    except grpc.aio.AioRpcError as e:
        if case.action == "cancel" and e.code() is grpc.StatusCode.CANCELLED:
            return grpc.StatusCode.OK, allowed
        return (e.code(), e.details()), allowed


CaseRunner = Callable[[Any, grpc.aio.Channel, "httpx.AsyncClient | None", Case],
                      Coroutine[Any, Any, tuple[Any, frozenset]]]


async def run_http_case(http: httpx.AsyncClient, k: Case) -> int:
    """An `http` case (`payload`: method, path, body bytes) and its status; `cancel`: leave
    after the first bytes of the answer."""
    method, path, data = k.payload
    headers = {"Content-Type": "application/json"}
    if k.action == "cancel":
        async with http.stream(method, path, content=data, headers=headers) as r:
            async for _ in r.aiter_bytes():
                break
            return r.status_code
    return (await http.request(method, path, content=data, headers=headers)).status_code


def fuzz_service(pod: ServerProcess, stub_class: type, run_case: CaseRunner,
                 cases: st.SearchStrategy[Case], one_token: Callable[[str], Any],
                 examples: int, size: int, http: bool = False) -> int:
    """Fuzz the engine service `stub_class` of `pod` (`run_case(stub, channel, http, case)`:
    what came back and what may; `http`: an httpx client on the pod's HTTP port too). The
    properties: every answer is a status the servicer documents that a serving pod may give
    (`documented.py`), no read hangs; afterwards the pod is idle (nothing running or waiting,
    every KV block free) and each pooled id is free again (`one_token(rid)`: a one-token
    GenerateRequest). The number of cases run; the caller checks the pod's log."""
    loop = LoopThread()
    clients: dict[str, Any] = {}

    async def connect() -> None:
        clients["channel"] = grpc.aio.insecure_channel(
            pod.target, options=[("grpc.max_send_message_length", -1)])
        clients["stub"] = stub_class(clients["channel"])
        clients["http"] = (httpx.AsyncClient(base_url=pod.http_url, timeout=READ_TIMEOUT)
                           if http else None)

    async def run(batch: list[Case]) -> list[tuple[Case, Any]]:
        results = await asyncio.gather(*(run_case(clients["stub"], clients["channel"],
                                                  clients["http"], k) for k in batch))
        return [(k, answer) for k, (answer, allowed) in zip(batch, results, strict=True)
                if status_of(answer) not in allowed]

    try:
        loop.run(connect())
        count = run_batches(loop, run, cases, examples, size)
        loop.run(assert_service_idle(pod, stub_class, one_token))
    finally:
        if "channel" in clients:
            loop.run(clients["channel"].close())
        if clients.get("http") is not None:
            loop.run(clients["http"].aclose())
        loop.stop()
    return count


async def assert_service_idle(pod: ServerProcess, stub_class: type,
                              one_token: Callable[[str], Any]) -> None:
    """Nothing runs or waits, every KV block is free, and no front end still holds a pooled
    id in flight: each runs one token, asked from a new connection, which the fuzzer's
    remembered Aborts (an Abort that may precede its Generate) do not reach."""
    async with AsyncClient(pod.target) as client:
        await released(client, (await client.list_deployments()).deployments[0].name,
                       timeout=30)
    own = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(pod.target, options=own) as channel:
        stub = stub_class(channel)
        for rid in ID_POOL:
            msgs = [m async for m in stub.Generate(one_token(rid))]
            assert msgs[-1].complete.completion_tokens == 1
