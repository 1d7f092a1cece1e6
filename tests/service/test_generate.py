"""Generate over a real gRPC server: streaming order, final chunk, determinism, stop rules."""

from __future__ import annotations

import asyncio
import itertools

from fleets import assert_released

from doppelchip.v1 import inference_pb2 as pb
from server.engine.tokenizer import get_tokenizer


async def collect(client, prompt="hello world", **kwargs) -> list[pb.GenerateResponse]:
    return [chunk async for chunk in client.generate(prompt, **kwargs)]


async def test_stream_order_and_final_chunk(client):
    chunks = await collect(
        client, max_tokens=12, ignore_eos=True, return_token_times=True,
        return_prompt_token_ids=True, request_id="order-1",
    )
    assert all(c.request_id == "order-1" for c in chunks)
    assert [c.HasField("final") for c in chunks] == [False] * (len(chunks) - 1) + [True]
    tokens = [t for c in chunks for t in c.token_ids]
    times = [t for c in chunks for t in c.token_times]
    assert len(tokens) == 12 and len(times) == 12
    # index of each chunk is the position of its first token: contiguous, in order
    position = 0
    for c in chunks:
        if c.token_ids:
            assert c.index == position
        position += len(c.token_ids)
    assert times == sorted(times) and times[0] > 0
    prompt_ids = get_tokenizer().encode("hello world")
    assert list(chunks[0].prompt_token_ids) == prompt_ids
    final = chunks[-1].final
    assert final.finish_reason == pb.FINISH_REASON_LENGTH
    assert final.usage.prompt_tokens == len(prompt_ids)
    assert final.usage.completion_tokens == 12
    assert final.deployment == "fast"
    t = final.timings
    assert 0 <= t.queue_s <= t.ttft_s <= t.e2e_s
    assert abs(t.ttft_s - times[0]) < 1e-9 and abs(t.e2e_s - times[-1]) < 1e-9
    assert abs(t.decode_s - (times[-1] - times[0])) < 1e-9
    # alone on the deployment, every token is its own decode step: strictly later each time
    assert all(b > a for a, b in itertools.pairwise(times))
    assert "".join(c.text for c in chunks) != ""
    await assert_released(client, "fast")


async def test_server_assigns_request_id_and_default_deployment(client):
    chunks = await collect(client, max_tokens=3, ignore_eos=True)
    rid = chunks[0].request_id
    assert rid.startswith("req-") and all(c.request_id == rid for c in chunks)
    assert chunks[-1].final.deployment == "fast"


async def test_select_deployment_by_name_and_by_model(client):
    by_name = await collect(client, deployment="slow", max_tokens=2, ignore_eos=True)
    assert by_name[-1].final.deployment == "slow"
    by_model = await collect(client, model="llama-3.1-70b", max_tokens=2, ignore_eos=True)
    assert by_model[-1].final.deployment == "slow"


async def test_same_request_same_tokens_and_seed_changes_them(client):
    a = await collect(client, max_tokens=20, ignore_eos=True, seed=7)
    b = await collect(client, max_tokens=20, ignore_eos=True, seed=7)
    c = await collect(client, max_tokens=20, ignore_eos=True, seed=8)
    ids = [[t for ch in run for t in ch.token_ids] for run in (a, b, c)]
    assert ids[0] == ids[1] and ids[0] != ids[2]


async def test_token_ids_prompt_is_accepted(client):
    chunks = await collect(client, [5, 6, 7, 8], max_tokens=4, ignore_eos=True)
    assert chunks[-1].final.usage.prompt_tokens == 4


async def test_eos_ends_with_stop_unless_ignored(client):
    # 16 requests with different seeds: the mock model's EOS (mean length 128) ends some early
    runs = await asyncio.gather(
        *(collect(client, max_tokens=200, seed=s) for s in range(16))
    )
    reasons = {r[-1].final.finish_reason for r in runs}
    assert pb.FINISH_REASON_STOP in reasons
    lengths = [r[-1].final.usage.completion_tokens for r in runs]
    assert min(lengths) < 200


async def test_stop_string_truncates_text(client):
    full = await collect(client, max_tokens=60, ignore_eos=True, seed=3)
    text = "".join(c.text for c in full)
    stop = text[20:23]
    first = text.find(stop)
    chunks = await collect(client, max_tokens=60, ignore_eos=True, seed=3, stop=[stop])
    out = "".join(c.text for c in chunks)
    assert out == text[:first]
    assert chunks[-1].final.finish_reason == pb.FINISH_REASON_STOP
    assert chunks[-1].final.stop_str == stop
    kept = await collect(
        client, max_tokens=60, ignore_eos=True, seed=3, stop=[stop],
        include_stop_str_in_output=True,
    )
    assert "".join(c.text for c in kept) == text[: first + len(stop)]


async def test_stop_token_id(client):
    full = await collect(client, max_tokens=30, ignore_eos=True, seed=5)
    ids = [t for c in full for t in c.token_ids]
    target = ids[10]
    chunks = await collect(client, max_tokens=30, ignore_eos=True, seed=5,
                           stop_token_ids=[target])
    got = [t for c in chunks for t in c.token_ids]
    assert got == ids[: ids.index(target) + 1]
    assert chunks[-1].final.stop_token_id == target
