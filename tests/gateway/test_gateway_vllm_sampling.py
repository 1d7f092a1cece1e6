"""Logprobs and n > 1 on the vLLM engine gRPC service (what smg forwards for `logprobs`,
`top_logprobs`, `prompt_logprobs` and `n`): the shapes smg-grpc-servicer builds from vLLM's
outputs, and the same emulated numbers and sequences the pod's own HTTP routes give the same
request (server/vllm_logprobs.py, server/frontend/parallel.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
from fleets import assert_released
from smg_grpc_proto import vllm_engine_pb2 as vpb
from smg_grpc_proto import vllm_engine_pb2_grpc as vpb_grpc

from clients.client import AsyncClient
from server.engine.interface import Finish, FinishReason, Timings, TokenChunk, Usage
from server.engine.tokenizer import get_tokenizer
from server.vllm_servicer import GenerateMessages

TOK = get_tokenizer()
PROMPT = TOK.encode("The quick brown fox jumps over the lazy dog")
SAMPLING = {"max_tokens": 6, "ignore_eos": True, "seed": 11, "temperature": 0.8}


@pytest.fixture
async def stub(server) -> AsyncIterator[vpb_grpc.VllmEngineStub]:
    async with grpc.aio.insecure_channel(server.target) as channel:
        yield vpb_grpc.VllmEngineStub(channel)


async def generate(stub, stream: bool, **sampling) -> list[vpb.GenerateResponse]:
    request = vpb.GenerateRequest(tokenized=vpb.TokenizedInput(input_ids=PROMPT),
                                  sampling_params=vpb.SamplingParams(**{**SAMPLING, **sampling}),
                                  stream=stream)
    return [m async for m in stub.Generate(request)]


async def test_the_numbers_are_the_http_routes(stub, server):
    (done,) = await generate(stub, False, logprobs=3, prompt_logprobs=2)
    out, inp = done.complete.output_logprobs, done.complete.input_logprobs
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        body = http.post("/v1/completions", json={
            "model": "llama-3.1-8b", "prompt": PROMPT, "logprobs": 3, "prompt_logprobs": 2,
            **SAMPLING}).json()
    choice = body["choices"][0]
    assert list(done.complete.output_ids) == TOK.encode(choice["text"])  # the same tokens
    # every output token: its id, its logprob, and its 3 most likely (itself first)
    assert list(out.token_ids) == list(done.complete.output_ids)
    assert list(out.token_logprobs) == pytest.approx(choice["logprobs"]["token_logprobs"],
                                                     rel=1e-6)  # (the proto's are float32)
    assert [len(t.token_ids) for t in out.top_logprobs] == [3] * 6
    assert [t.token_ids[0] for t in out.top_logprobs] == list(out.token_ids)
    for top, http_top in zip(out.top_logprobs, choice["logprobs"]["top_logprobs"], strict=True):
        assert list(top.values) == pytest.approx(list(http_top.values()), rel=1e-6)
        assert list(top.values) == sorted(top.values, reverse=True)
    # the prompt: the first token has no logprob and an empty top, the others vLLM's
    assert list(inp.token_ids) == PROMPT
    assert not inp.token_logprobs[0].HasField("value") and not inp.top_logprobs[0].values
    http_prompt = choice["prompt_logprobs"]
    for i, t in enumerate(PROMPT[1:], 1):
        assert inp.token_logprobs[i].value == pytest.approx(http_prompt[i][str(t)]["logprob"],
                                                            rel=1e-6)
        top = inp.top_logprobs[i]
        assert top.token_ids[0] == t and len(top.values) == 2


async def test_a_stream_carries_each_chunks_own_and_the_prompts_once(stub, server):
    (whole,) = await generate(stub, False, logprobs=0, prompt_logprobs=0)
    msgs = await generate(stub, True, logprobs=0, prompt_logprobs=0)
    chunks = [m.chunk for m in msgs if m.HasField("chunk")]
    (last,) = [m.complete for m in msgs if m.HasField("complete")]
    streamed = [v for c in chunks for v in c.output_logprobs.token_logprobs]
    assert streamed == list(whole.complete.output_logprobs.token_logprobs)
    assert not any(c.output_logprobs.top_logprobs for c in chunks)  # logprobs 0: no top
    assert [c.HasField("input_logprobs") for c in chunks] == [True] + [False] * (len(chunks) - 1)
    assert chunks[0].input_logprobs == whole.complete.input_logprobs
    # the complete repeats the last delta's, as vLLM's servicer does
    assert list(last.output_logprobs.token_ids) == list(last.output_ids) == list(
        chunks[-1].token_ids)
    assert list(last.output_logprobs.token_logprobs) == list(
        chunks[-1].output_logprobs.token_logprobs)
    # without logprobs asked, nothing is attached
    (plain,) = await generate(stub, False)
    assert not plain.complete.HasField("output_logprobs")
    assert not plain.complete.HasField("input_logprobs")
    async with AsyncClient(server.target) as client:
        await assert_released(client, "fast")


async def test_n_sequences_are_the_http_routes_choices(stub, server):
    """n = 3: three sequences, each its own seed (vLLM's seed + i), as the HTTP route's choices;
    streamed, each chunk names its sequence and each sequence ends with its own complete."""
    with httpx.Client(base_url=server.http_url, timeout=30) as http:
        body = http.post("/v1/completions", json={
            "model": "llama-3.1-8b", "prompt": PROMPT, "n": 3, "logprobs": 1,
            **SAMPLING}).json()
    texts = [c["text"] for c in sorted(body["choices"], key=lambda c: c["index"])]
    assert len(set(texts)) == 3  # (different seeds: different sequences)
    whole = await generate(stub, False, n=3, logprobs=1)
    assert [m.complete.index for m in whole] == [0, 1, 2]
    assert [TOK.decode(list(m.complete.output_ids)) for m in whole] == texts
    for m, choice in zip(whole, sorted(body["choices"], key=lambda c: c["index"]), strict=True):
        assert list(m.complete.output_logprobs.token_logprobs) == pytest.approx(
            choice["logprobs"]["token_logprobs"], rel=1e-6)
    msgs = await generate(stub, True, n=3)
    for i, text in enumerate(texts):
        chunks = [m.chunk for m in msgs if m.HasField("chunk") and m.chunk.index == i]
        (done,) = [m.complete for m in msgs if m.HasField("complete") and m.complete.index == i]
        assert TOK.decode([t for c in chunks for t in c.token_ids]) == text
        assert list(done.output_ids) == list(chunks[-1].token_ids)  # the last delta
    # sequences that end at different steps (a stop token among half the words each step):
    # the completes of a request not streamed come together, in sequence order, as vLLM's
    stops = TOK.free_text_token_ids[::2]
    ended = await generate(stub, False, n=4, stop_token_ids=stops, ignore_eos=False)
    assert [m.complete.index for m in ended] == [0, 1, 2, 3]
    assert len({m.complete.completion_tokens for m in ended}) > 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await generate(stub, False, n=129)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "n must be in [1, 128]" in err.value.details()
    async with AsyncClient(server.target) as client:
        await assert_released(client, "fast")


def test_a_request_not_streamed_answers_its_sequences_in_order_whatever_ends_first():
    """vLLM's servicer answers a finished request's outputs in sequence order; the service's
    messages keep every complete until all ended (timing-free: the chunks given in the order
    a second sequence finishing first would bring them)."""
    out = GenerateMessages(False, 3, None, [None, None], None)
    end = Finish(FinishReason.LENGTH, Usage(prompt_tokens=3), Timings())
    assert out.of(1, TokenChunk(token_ids=(7,), finish=end)) == []  # kept, nothing sent
    assert out.of(0, TokenChunk(token_ids=(5,))) == [] and not out.all_finished
    assert out.of(0, TokenChunk(token_ids=(6,), finish=end)) == []
    ended = out.ended()
    assert [m.complete.index for m in ended] == [0, 1] and out.all_finished
    assert [list(m.complete.output_ids) for m in ended] == [[5, 6], [7]]
