"""vLLM 0.34.0's `--max-num-inflight-kv-loads` on a decode pod: with the cap set, P/D pulls
start while every seat is taken (a load takes neither a seat nor budget until its KV has
arrived), at most the cap of requests hold blocks for loads (in flight, or landed and not yet
running), a pull past the cap waits where it is while a request that needs no load may still
be admitted, a load from the CPU tier past the cap waits at the head of the queue, and without
the cap nothing changes (0.33.0's scheduling: tests/engine/test_kv_pulls.py). The scheduler's
invariants hold after every step; however a request ends, its pull is told once."""

from __future__ import annotations

import random

from engine_drive import request
from test_kv_pulls import PROMPT, decode_pod, pulled, tick

from server.engine.build import build_core
from server.engine.options import EngineOptions
from server.engine.request import RequestStatus
from server.engine.tokenizer import get_tokenizer


def busy(rid: str = "busy", n: int = 40):
    return request(rid, list(range(200, 230)), n, ignore_eos=True)


def test_pulls_start_while_every_seat_is_taken_up_to_the_cap():
    sched, model, link = decode_pod(max_num_seqs=1, max_num_inflight_kv_loads=2)
    sched.add_request(busy())
    tick(sched, model, 0.0)  # busy holds the one seat
    for rid in ("a", "b", "c"):
        sched.add_request(pulled(rid))
    tick(sched, model, 0.01)
    assert set(link.started) == {"a", "b"}  # two started with no seat; c is past the cap
    assert {r: sched.requests[r].status for r in "abc"} == {
        "a": RequestStatus.WAITING_FOR_REMOTE_KVS, "b": RequestStatus.WAITING_FOR_REMOTE_KVS,
        "c": RequestStatus.WAITING}
    assert sched.kv_fetch_stages() == (1, 2, 0)
    assert [r.request_id for r in sched.running] == ["busy"]


def test_landed_requests_count_until_they_run_and_free_the_cap_as_they_do():
    sched, model, link = decode_pod(max_num_seqs=1, max_num_inflight_kv_loads=2)
    sched.add_request(busy(n=60))
    tick(sched, model, 0.0)
    for rid in ("a", "b", "c"):
        sched.add_request(pulled(rid))
    t = 0.01
    tick(sched, model, t)
    for _ in range(20):  # a and b land (two links' time); busy still holds the seat
        t += 0.05
        tick(sched, model, t)
        if sched.kv_fetch_stages()[2] == 2:
            break
    assert sched.kv_fetch_stages() == (1, 0, 2) and "c" not in link.started
    for _ in range(100):
        if "busy" not in sched.requests:
            break
        t += 0.05
        tick(sched, model, t)
        assert "c" not in link.started
    t += 0.05
    tick(sched, model, t)  # busy's seat is free: a takes it, and c's pull starts in that
    #                        same step (landed b alone holds a load now)
    assert [r.request_id for r in sched.running] == ["a"]
    assert link.started["c"][1] == t and sched.kv_fetch_stages() == (0, 1, 1)


def test_a_pull_past_the_cap_waits_in_place_while_a_plain_request_goes():
    sched, model, link = decode_pod(max_num_seqs=4, max_num_inflight_kv_loads=1)
    sched.add_request(pulled("a"))
    sched.add_request(pulled("b"))
    sched.add_request(request("p", list(range(300, 340)), 5, ignore_eos=True))
    tick(sched, model, 0.0)
    assert set(link.started) == {"a"}
    assert [r.request_id for r in sched.running] == ["p"]  # admitted past the capped b
    assert [r.request_id for r in sched.waiting] == ["b"]
    assert sched.kv_fetch_stages() == (1, 1, 0)


def test_without_the_cap_a_full_pod_starts_no_pull():
    sched, model, link = decode_pod(max_num_seqs=1)
    sched.add_request(busy())
    tick(sched, model, 0.0)
    sched.add_request(pulled("a"))
    tick(sched, model, 0.01)
    assert not link.started and sched.kv_fetch_stages() == (1, 0, 0)


def test_aborts_of_started_and_capped_pulls_tell_the_connector_once_and_free_everything():
    sched, model, link = decode_pod(max_num_seqs=1, max_num_inflight_kv_loads=1)
    sched.add_request(busy())
    tick(sched, model, 0.0)
    free = sched.pool.num_free
    sched.add_request(pulled("a"))
    sched.add_request(pulled("b"))
    tick(sched, model, 0.01)
    assert set(link.started) == {"a"} and sched.pool.num_free < free
    sched.abort("a")  # mid-pull: its blocks go, and b's pull may start at the next step
    sched.check_integrity()
    assert sched.pool.num_free == free
    tick(sched, model, 0.02)
    assert set(link.started) == {"a", "b"}
    sched.abort("b")
    sched.abort("busy")
    sched.check_integrity()
    assert sorted(link.ended) == [("a", False), ("b", False)]
    assert sched.pool.num_free + sched.cache.evictable_blocks == sched.pool.num_blocks


def test_the_capped_pulls_tokens_are_the_aggregated_deployments():
    sched, model, link = decode_pod(max_num_seqs=1, max_num_inflight_kv_loads=3)
    sched.add_request(busy(n=8))
    for rid in ("a", "b"):
        sched.add_request(pulled(rid, max_tokens=6))
    t, done = 0.0, {}
    for _ in range(1000):
        if not sched.has_unfinished():
            break
        out = sched.schedule(t)
        for r in sched.update(out, model.next_tokens(out, sched.requests)):
            done[r.request_id] = r
        sched.check_integrity()
        t += 0.01
    assert [len(done[r].output_token_ids) for r in "ab"] == [6, 6]
    assert all(done[r].num_computed_tokens >= len(PROMPT) for r in "ab")
    assert sorted(link.ended) == [("a", True), ("b", True)]


def cpu_tier_reloads(cap: int | None) -> tuple:
    """Two prompts the device evicted, then both sent again at once: their loads from the
    CPU tier, under `cap`. The stages after the first step, and each one's status."""
    # 16-token blocks (vLLM 0.34.0's default is 64): 64 of them hold two 420-token prompts
    opts = EngineOptions(name="a", model="llama-3.1-8b", quant="bf16", chip="h100-sxm",
                         engine="vllm", kv_blocks=64, block_size=16,  # 1,024 tokens
                         max_model_len=2048,
                         kv_offloading_size=1.0, max_num_seqs=4,
                         max_num_inflight_kv_loads=cap)
    core = build_core(opts, get_tokenizer())
    sched = core.scheduler
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 20000) for _ in range(420)] for _ in range(4)]
    t = 0.0
    for i, p in enumerate(prompts):  # each alone: the device keeps the last two
        sched.add_request(request(f"w{i}", p, 2, ignore_eos=True))
        while core.has_unfinished():
            t += core.step(t).seconds
    for i in (0, 1):
        sched.add_request(request(f"again{i}", prompts[i], 2, ignore_eos=True))
    out = sched.schedule(t)
    sched.update(out, {s.request_id: [5] for s in out.scheduled if s.samples_token})
    sched.check_integrity()
    return sched.kv_fetch_stages(), [sched.requests[f"again{i}"].status for i in (0, 1)]


def test_cpu_tier_loads_count_toward_the_cap_and_wait_at_the_head():
    assert cpu_tier_reloads(None) == ((0, 2, 0), [RequestStatus.WAITING_FOR_REMOTE_KVS] * 2)
    assert cpu_tier_reloads(1) == ((1, 1, 0), [RequestStatus.WAITING_FOR_REMOTE_KVS,
                                               RequestStatus.WAITING])
