"""End to end through the real smg gateway (the `smg` dev dependency) on loopback: OpenAI HTTP
in, vllm.grpc.engine.VllmEngine to in-process doppelchip replicas, text and usage out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
from fleets import assert_released
from gateway_harness import SMG, Gateway, gateway, gateway_fleet
from server_proc import until
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc

from clients.client import AsyncClient
from server.engine.tokenizer import get_tokenizer

pytestmark = pytest.mark.skipif(SMG is None, reason="smg is not installed (make install-dev)")

TOK = get_tokenizer()
PROMPT = ("The quick brown fox jumps over the lazy dog and then runs far away into the dark "
          "forest where nobody can find it again for many years to come")
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say something about foxes."}]
COLD = {"name": "cold", "model": "llama-3.1-8b", "quant": "fp8", "chip": "h100-sxm",
        "engine": "tensorrt-llm", "built_for": "hopper", "start": "cold", "max_model_len": 512}


@pytest.fixture
async def replicas(tmp_path) -> AsyncIterator[Gateway]:
    """Two replicas of the `fast` deployment behind smg (round robin)."""
    async with gateway(tmp_path, [gateway_fleet(), gateway_fleet()]) as gw:
        yield gw


@pytest.fixture
async def slow_gateway(tmp_path) -> AsyncIterator[Gateway]:
    """One replica fronting `slow` (one running sequence, two waiting at most)."""
    async with gateway(tmp_path, [gateway_fleet(vllm_engine_deployment="slow")]) as gw:
        yield gw


def stream_text(events: list[dict], chat: bool) -> str:
    if chat:
        return "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    return "".join(c["text"] for e in events for c in e["choices"])


async def test_completions_and_chat_with_usage_streaming_and_not(replicas):
    gw = replicas
    prompt_ids = TOK.encode(PROMPT)
    body = {"model": gw.model, "prompt": PROMPT, "max_tokens": 12, "ignore_eos": True,
            "seed": 5}
    status, done = await gw.call("POST", "/v1/completions", body)
    assert status == 200, done
    assert done["choices"][0]["text"] and done["choices"][0]["finish_reason"] == "length"
    assert done["usage"]["prompt_tokens"] == len(prompt_ids)
    assert done["usage"]["completion_tokens"] == 12
    status, events = await gw.stream("/v1/completions", {
        **body, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    assert stream_text(events, chat=False) == done["choices"][0]["text"]  # same seed, same text
    usage = events[-1]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(prompt_ids), 12)

    chat_ids = TOK.encode_chat(MESSAGES)  # smg applies the chat template GetTokenizer shipped
    chat = {"model": gw.model, "messages": MESSAGES, "max_tokens": 9, "ignore_eos": True,
            "seed": 5}
    status, done = await gw.call("POST", "/v1/chat/completions", chat)
    assert status == 200, done
    assert done["choices"][0]["message"]["content"]
    assert done["usage"]["prompt_tokens"] == len(chat_ids)
    assert done["usage"]["completion_tokens"] == 9
    status, events = await gw.stream("/v1/chat/completions", {
        **chat, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    assert stream_text(events, chat=True) == done["choices"][0]["message"]["content"]
    usage = events[-1]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(chat_ids), 9)

    # A stop string ends the generation in the worker (fewer tokens, finish reason stop).
    status, plain = await gw.call("POST", "/v1/completions", body)
    done_text = plain["choices"][0]["text"]
    stop = done_text[len(done_text) // 2 :][:3]
    status, text = await gw.call("POST", "/v1/completions", {**body, "stop": [stop]})
    assert status == 200 and text["choices"][0]["finish_reason"] == "stop"
    assert text["usage"]["completion_tokens"] < 12 and stop not in text["choices"][0]["text"]

    # By now both replicas have served this prompt (round robin), so its prefix is cached.
    status, again = await gw.call("POST", "/v1/completions", body)
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (len(prompt_ids) - 1) // 16 * 16 > 0
    # Both replicas took traffic.
    for replica in gw.replicas:
        text = await asyncio.to_thread(replica.scrape)
        line = next(x for x in text.splitlines()
                    if x.startswith("vllm:generation_tokens_total") and 'deployment="fast"' in x)
        assert float(line.rsplit(" ", 1)[1]) > 0
        async with AsyncClient(replica.target) as client:
            await assert_released(client, "fast")


async def test_logprobs_and_n_pass_through_smg(replicas):
    """An OpenAI client's logprobs and n through smg: it asks the vLLM engine service for them
    and writes the emulated values and sequences a pod's own HTTP route gives the request."""
    gw = replicas
    chat = {"model": gw.model, "messages": MESSAGES, "max_tokens": 5, "ignore_eos": True,
            "seed": 5, "logprobs": True, "top_logprobs": 2}
    status, done = await gw.call("POST", "/v1/chat/completions", chat)
    assert status == 200, done
    content = done["choices"][0]["logprobs"]["content"]
    assert len(content) == 5
    for entry in content:
        tops = entry["top_logprobs"]
        assert len(tops) == 2 and tops[0]["logprob"] == entry["logprob"] >= tops[1]["logprob"]
    # the same request on one replica's own HTTP route: the same numbers
    own = await asyncio.to_thread(_post, gw.replicas[0].http_url + "/v1/chat/completions",
                                  {**chat, "model": "llama-3.1-8b"})
    direct = own["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == [e["token"] for e in direct]
    assert [round(e["logprob"], 5) for e in content] == [round(e["logprob"], 5) for e in direct]
    # n = 2: two sequences, the replica's own two choices
    body = {"model": gw.model, "messages": MESSAGES, "max_tokens": 6, "ignore_eos": True,
            "seed": 3, "n": 2}
    status, done = await gw.call("POST", "/v1/chat/completions", body)
    assert status == 200, done
    own = await asyncio.to_thread(_post, gw.replicas[0].http_url + "/v1/chat/completions",
                                  {**body, "model": "llama-3.1-8b"})

    def texts(answer: dict) -> list[str]:
        return [c["message"]["content"]
                for c in sorted(answer["choices"], key=lambda c: c["index"])]

    assert texts(done) == texts(own) and texts(own)[0] != texts(own)[1]
    assert done["usage"]["completion_tokens"] == 12


def _post(url: str, body: dict) -> dict:
    return httpx.post(url, json=body, timeout=30).json()


async def test_client_disconnect_aborts_and_frees_kv(slow_gateway):
    gw = slow_gateway
    replica = gw.replicas[0]
    status, events = await gw.stream("/v1/completions", {
        "model": gw.model, "prompt": PROMPT, "max_tokens": 3000, "ignore_eos": True,
        "stream": True}, max_events=2)
    assert status == 200 and len(events) == 2
    replica.wait_for_log(r"\[request_id=cmpl-\S+\] finished on slow: abort")
    assert "Abort from the client" in replica.log  # smg sent the Abort RPC
    async with AsyncClient(replica.target) as client:
        await assert_released(client, "slow")


async def test_errors_map_to_http_status(slow_gateway):
    gw = slow_gateway
    client = AsyncClient(gw.replicas[0].target)
    # 400: the worker refuses what the engine cannot serve (INVALID_ARGUMENT)
    status, body = await gw.call("POST", "/v1/completions", {
        "model": gw.model, "prompt": "hi", "max_tokens": 100_000})
    assert status == 400 and "context" in body["error"]["message"]
    # 429: one running and two waiting (sent straight to the replica) fill `slow`; the next
    # request through smg is RESOURCE_EXHAUSTED there
    ids = TOK.encode(PROMPT)
    async with grpc.aio.insecure_channel(gw.urls[0].removeprefix("grpc://")) as channel:
        stub = vpb_grpc.VllmEngineStub(channel)
        busy = [stub.Generate(vpb.GenerateRequest(
            request_id=f"busy-{i}", tokenized=vpb.TokenizedInput(input_ids=ids), stream=True,
            sampling_params=vpb.SamplingParams(max_tokens=3000, ignore_eos=True)))
            for i in range(3)]
        try:
            await until(client, "slow",
                        lambda d: (d.load.num_running, d.load.num_waiting) == (1, 2))
            status, body = await gw.call("POST", "/v1/completions", {
                "model": gw.model, "prompt": "one more", "max_tokens": 2})
            assert status == 429, body
            assert "queue is full" in body["error"]["message"]
        finally:
            await stub.Abort(vpb.AbortRequest(request_ids=[f"busy-{i}" for i in range(3)]))
            for call in busy:
                call.cancel()
    await assert_released(client, "slow")
    await client.close()


async def test_cold_deployment_is_503(tmp_path):
    async with gateway(tmp_path, [gateway_fleet([COLD])], wait=False) as gw:
        status, body = None, None
        loop = asyncio.get_running_loop()
        end = loop.time() + 20
        while loop.time() < end:  # until smg has registered the worker and answers for it
            try:
                status, body = await gw.call("POST", "/v1/completions", {
                    "model": "llama-3.1-8b", "prompt": "hi", "max_tokens": 2})
            except OSError:
                status = None
            if status is not None and status != 404 and "tokenizer" not in str(body):
                break
            await asyncio.sleep(0.05)
        assert status == 503, body
        assert "compiling" in body["error"]["message"]
