"""The soak's mixed load (`benchmarks/bench_soak.py`): what one worker does, request after
request, until the deadline.

Each worker draws its next request from a seeded generator: gRPC streams of varied lengths,
streams it cancels after a few chunks, JSON-schema-constrained output (gRPC and HTTP), HTTP
SSE streams (some dropped mid-stream), VllmEngine streams ended by Abort, and bad requests
(invalid UTF-8 on the wire, a control character in the id, an unknown deployment or model,
NaN sampling, too many stop strings). Every outcome is counted as `kind: result`; a result
outside the kind's expected set is counted under `unexpected`.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
import grpc
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc

from clients.client import build_request
from clients.structured import ORDER_SCHEMA
from doppelchip.v1 import inference_pb2_grpc as pb_grpc

DEPLOYMENTS = ("soak-a", "soak-b")
MODEL = "llama-3.1-8b"
LENGTHS = (4, 16, 64, 256, 1024)
RAW_BAD_UTF8 = b"\x0a\x02\xff\xfe"  # GenerateRequest.request_id = bytes ff fe: not UTF-8
# what each kind may end in; anything else is `unexpected`
EXPECTED = {
    "grpc_stream": {"length", "stop", "RESOURCE_EXHAUSTED"},
    "grpc_cancel": {"cancelled", "length", "stop", "RESOURCE_EXHAUSTED"},
    "grpc_json": {"length", "stop", "RESOURCE_EXHAUSTED"},
    "vllm_abort": {"abort", "length", "stop", "RESOURCE_EXHAUSTED"},
    "http_stream": {"200", "dropped", "429"},
    "http_json": {"200", "429"},
    "bad_utf8": {"INVALID_ARGUMENT"},
    "bad_id": {"INVALID_ARGUMENT"},
    "bad_deployment": {"NOT_FOUND"},
    "bad_model": {"404"},
    "bad_nan": {"400"},
    "bad_stops": {"400"},
}
WEIGHTS = {"grpc_stream": 26, "grpc_cancel": 10, "grpc_json": 8, "vllm_abort": 6,
           "http_stream": 20, "http_json": 8, "bad_utf8": 4, "bad_id": 4,
           "bad_deployment": 3, "bad_model": 3, "bad_nan": 4, "bad_stops": 4}


@dataclass
class Tally:
    counts: Counter = field(default_factory=Counter)
    unexpected: Counter = field(default_factory=Counter)

    def add(self, kind: str, result: str) -> None:
        self.counts[f"{kind}: {result}"] += 1
        if result not in EXPECTED[kind]:
            self.unexpected[f"{kind}: {result}"] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class Load:
    """The clients one load run shares: a gRPC channel, a VllmEngine channel, an HTTP
    session."""

    def __init__(self, grpc_port: int, http_port: int) -> None:
        target = f"127.0.0.1:{grpc_port}"
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = pb_grpc.InferenceStub(self.channel)
        self.vllm_channel = grpc.aio.insecure_channel(
            target, options=[("grpc.use_local_subchannel_pool", 1)])
        self.vllm = vpb_grpc.VllmEngineStub(self.vllm_channel)
        self.base = f"http://127.0.0.1:{http_port}"
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        self.tally = Tally()
        self._seq = 0

    async def close(self) -> None:
        await self.http.close()
        await self.channel.close()
        await self.vllm_channel.close()

    def rid(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}-{self._seq}"

    async def worker(self, seed: int, deadline: float) -> None:
        rng = random.Random(seed)
        kinds, weights = list(WEIGHTS), list(WEIGHTS.values())
        loop = asyncio.get_running_loop()
        while loop.time() < deadline:
            kind = rng.choices(kinds, weights)[0]
            try:
                result = await asyncio.wait_for(getattr(self, kind)(rng), 120)
            except grpc.aio.AioRpcError as e:
                result = e.code().name
            except TimeoutError:
                result = "timeout"
            except aiohttp.ClientError as e:
                result = f"client error {type(e).__name__}"
            self.tally.add(kind, result)

    # ---- gRPC -------------------------------------------------------------------------------
    async def _stream(self, request, cancel_after: int | None = None) -> str:
        call = self.stub.Generate(request, timeout=60)
        n = 0
        async for chunk in call:
            n += 1
            if chunk.HasField("final"):
                return {1: "stop", 2: "length", 3: "abort"}.get(chunk.final.finish_reason,
                                                                 "other")
            if cancel_after is not None and n >= cancel_after:
                call.cancel()
                return "cancelled"
        return "no final"

    async def grpc_stream(self, rng: random.Random) -> str:
        return await self._stream(build_request(
            "soak " * rng.randint(1, 200), deployment=rng.choice(DEPLOYMENTS),
            max_tokens=rng.choice(LENGTHS), ignore_eos=rng.random() < 0.5,
            seed=rng.randint(0, 1 << 20), request_id=self.rid("g")))

    async def grpc_cancel(self, rng: random.Random) -> str:
        return await self._stream(build_request(
            "cancel me", deployment=rng.choice(DEPLOYMENTS), max_tokens=1024,
            ignore_eos=True, request_id=self.rid("c")), cancel_after=rng.randint(1, 6))

    async def grpc_json(self, rng: random.Random) -> str:
        return await self._stream(build_request(
            "an order as JSON", deployment=rng.choice(DEPLOYMENTS), max_tokens=300,
            json_schema=ORDER_SCHEMA, seed=rng.randint(0, 1 << 20)))

    async def vllm_abort(self, rng: random.Random) -> str:
        rid = self.rid("v")
        call = self.vllm.Generate(vpb.GenerateRequest(
            request_id=rid, tokenized=vpb.TokenizedInput(input_ids=[5, 6, 7]), stream=True,
            sampling_params=vpb.SamplingParams(max_tokens=1024, ignore_eos=True)), timeout=60)
        first = True
        async for r in call:
            if first:
                first = False
                await asyncio.sleep(rng.random() * 0.05)
                await self.vllm.Abort(vpb.AbortRequest(request_ids=[rid]), timeout=10)
            if r.HasField("complete"):
                return r.complete.finish_reason
        return "no final"

    async def bad_utf8(self, rng: random.Random) -> str:
        method = rng.choice(("/doppelchip.v1.Inference/Generate",
                             "/vllm.grpc.engine.VllmEngine/Generate"))
        call = self.channel.unary_stream(method)(RAW_BAD_UTF8, timeout=10)
        async for _ in call:
            pass
        return "OK"

    async def bad_id(self, rng: random.Random) -> str:
        return await self._stream(build_request("x", request_id=f"bad\n{rng.random()}",
                                                max_tokens=4))

    async def bad_deployment(self, rng: random.Random) -> str:
        return await self._stream(build_request("x", deployment=f"nope-{rng.randint(0, 9)}",
                                                max_tokens=4))

    # ---- HTTP -------------------------------------------------------------------------------
    async def http_stream(self, rng: random.Random) -> str:
        body = {"model": MODEL, "prompt": "soak " * rng.randint(1, 100), "stream": True,
                "max_tokens": rng.choice(LENGTHS), "ignore_eos": rng.random() < 0.5}
        drop = rng.random() < 0.25
        async with self.http.post(f"{self.base}/v1/completions", json=body) as r:
            if r.status != 200:
                return str(r.status)
            async for line in r.content:
                if drop and line.startswith(b"data: "):
                    return "dropped"  # leaving the block closes the connection mid-stream
                if line.startswith(b"data: [DONE]"):
                    return "200"
        return "no [DONE]"

    async def http_json(self, rng: random.Random) -> str:
        body = {"model": MODEL, "max_tokens": 300,
                "messages": [{"role": "user", "content": "an order"}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "order", "schema": ORDER_SCHEMA}}}
        async with self.http.post(f"{self.base}/v1/chat/completions", json=body) as r:
            await r.read()
            return str(r.status)

    async def bad_model(self, rng: random.Random) -> str:
        async with self.http.post(f"{self.base}/v1/completions",
                                  json={"model": "no-such-model", "prompt": "x"}) as r:
            await r.read()
            return str(r.status)

    async def bad_nan(self, rng: random.Random) -> str:
        value = rng.choice((float("nan"), float("inf"), float("-inf")))
        text = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 4,
                           "temperature": value})  # NaN / Infinity literals, as JS writes them
        async with self.http.post(f"{self.base}/v1/completions", data=text,
                                  headers={"Content-Type": "application/json"}) as r:
            await r.read()
            return str(r.status)

    async def bad_stops(self, rng: random.Random) -> str:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 4,
                "stop": [f"stop-{i}" for i in range(rng.randint(300, 3000))]}
        async with self.http.post(f"{self.base}/v1/completions", data=json.dumps(body),
                                  headers={"Content-Type": "application/json"}) as r:
            await r.read()
            return str(r.status)
