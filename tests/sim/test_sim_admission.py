"""Admission control (`max_waiting`) in virtual time: requests arriving together at an idle
deployment count the batch's free seats before they count as waiting, in the simulator as in
the engine process (both call `intake.queue_is_full`)."""

from __future__ import annotations

from fleets import TEST_FLEET, fleet_doc

from clients.conversation import Conversation, Turn
from server.config import parse_fleet
from server.engine.build import build_core
from server.engine.intake import queue_is_full
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
