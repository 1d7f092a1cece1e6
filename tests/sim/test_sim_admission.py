"""Admission control in virtual time: `max_waiting` (requests arriving together at an idle
deployment count the batch's free seats before they count as waiting, in the simulator as in
the engine process: both call `intake.queue_is_full`) and vLLM's queue limits
(--max-num-queued-reqs, --max-num-queued-tokens: `intake.QueueLimits`, both too)."""

from __future__ import annotations

from fleets import TEST_FLEET, fleet_doc

from clients.conversation import Conversation, Turn
from server.config import parse_fleet
from server.engine.build import build_core
from server.engine.errors import MaxQueuedTokens, QueueOverflow
from server.engine.intake import (
    MAX_QUEUED_TOKENS,
    QUEUE_OVERFLOW,
    QueueLimits,
    queue_is_full,
)
from server.engine.request import Request
from server.engine.tokenizer import get_tokenizer
from sim.virtual import run_virtual


def slow_run(n: int):
    slow = next(d for d in TEST_FLEET["deployments"] if d["name"] == "slow")
    options = parse_fleet(fleet_doc(deployments=[slow])).deployments[0]
    assert (options.max_num_seqs, options.max_waiting) == (1, 2)
    sessions = [Conversation(f"s{i}", 0.0, (Turn(tuple(range(10 + i, 30 + i)), 5),),
                             ignore_eos=True, seed=i) for i in range(n)]
    return run_virtual(build_core(options, get_tokenizer()), sessions,
                       max_waiting=options.max_waiting).records


def test_one_seat_and_two_waiting_take_three_simultaneous_arrivals():
    records = {r.request_id: r for r in slow_run(4)}
    assert [records[f"s{i}"].error for i in range(4)] == [None, None, None, "RESOURCE_EXHAUSTED"]
    assert all(records[f"s{i}"].output_tokens == 5 for i in range(3))


def test_queue_is_full_counts_free_seats_first():
    assert not queue_is_full(num_queued=2, free_seats=1, max_waiting=2)
    assert queue_is_full(num_queued=3, free_seats=1, max_waiting=2)
    assert queue_is_full(num_queued=2, free_seats=0, max_waiting=2)


def queued_run(n: int, **limits):
    """`n` requests of 20 prompt tokens arriving together at a deployment with vLLM's queue
    limits `limits` (and room for all of them otherwise)."""
    fast = next(d for d in TEST_FLEET["deployments"] if d["name"] == "fast")
    options = parse_fleet(fleet_doc(deployments=[{**fast, **limits}])).deployments[0]
    sessions = [Conversation(f"s{i}", 0.0, (Turn(tuple(range(10 + i, 30 + i)), 5),),
                             ignore_eos=True, seed=i) for i in range(n)]
    records = run_virtual(build_core(options, get_tokenizer()), sessions,
                          max_waiting=options.max_waiting).records
    return [next(r for r in records if r.request_id == f"s{i}").error for i in range(n)]


def test_vllms_queue_limits_refuse_what_passes_them_as_unavailable():
    # (the same QueueLimits.refusal the engine process admits by: its words, its 503)
    assert queued_run(5, max_num_queued_reqs=3) == [None] * 3 + ["UNAVAILABLE"] * 2
    # 20 prompt tokens each, none past its prefill: the third finds 40 >= 40 queued
    assert queued_run(4, max_num_queued_tokens=40) == [None] * 2 + ["UNAVAILABLE"] * 2
    assert queued_run(5) == [None] * 5


def test_queue_limits_count_unfinished_and_prefilling_requests_as_vllm():
    prefilling = Request("a", list(range(10, 30)))  # 20 prompt tokens, no output yet
    decoding = Request("b", list(range(10, 40)))
    decoding.token_ids.append(7)  # past its prefill: its prompt no longer counts
    tokens = QueueLimits(max_num_queued_tokens=25)
    assert tokens.refusal([prefilling, decoding]) is None  # 20 < 25
    refused = tokens.refusal([prefilling, prefilling])  # 40 >= 25
    assert isinstance(refused, MaxQueuedTokens) and str(refused) == MAX_QUEUED_TOKENS
    reqs = QueueLimits(max_num_queued_reqs=2)
    assert reqs.refusal([decoding]) is None  # 1 + 1 <= 2
    refused = reqs.refusal([decoding, decoding])
    assert isinstance(refused, QueueOverflow) and str(refused) == QUEUE_OVERFLOW
    assert not QueueLimits().active and reqs.active
