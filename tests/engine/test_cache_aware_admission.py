"""vLLM 0.34.0's cache-aware admission (`--cache-aware-admission-window N`): once the KV usage
reaches `--cache-aware-admission-threshold`, the merely waiting requests among the first N are
admitted deepest cached prefix first, arrival order among equals; a preempted request keeps
its slot; FCFS with prefix caching only; a window of 0 (the default) admits in arrival order."""

from __future__ import annotations

from engine_drive import make, request

from server.engine.policy import FCFSQueue
from server.engine.request import RequestStatus

BS = 16
SHARED = [(5 * i) % 991 + 1 for i in range(64)]  # 4 blocks every warm request starts with


def prompt(tail: int, shared: bool) -> list[int]:
    head = SHARED if shared else [(11 * i + tail) % 983 + 1 for i in range(64)]
    return head + [tail + i for i in range(8)]


def pod(**config):
    """One seat taken by a request whose prompt leaves SHARED cached, so that the next step
    admits exactly one waiting request."""
    sched, model = make(num_blocks=24, block_size=BS, max_num_seqs=2, **config)
    sched.add_request(request("owner", prompt(500, True) + list(range(600, 640)), 60,
                              ignore_eos=True))
    for _ in range(2):
        out = sched.schedule()
        sched.update(out, model.next_tokens(out, sched.requests))
    return sched, model


def admitted_after_one_step(sched, model, *rids_shared) -> list[str]:
    for rid, shared in rids_shared:
        sched.add_request(request(rid, prompt(100 + sum(map(ord, rid)), shared), 4,
                                  ignore_eos=True))
    out = sched.schedule()
    sched.update(out, model.next_tokens(out, sched.requests))
    sched.check_integrity()
    return [r.request_id for r in sched.running if r.request_id != "owner"]


def test_a_warm_request_goes_before_an_earlier_cold_one():
    sched, model = pod(cache_aware_admission_window=4, cache_aware_admission_threshold=0.0)
    assert admitted_after_one_step(sched, model, ("cold", False), ("warm", True)) == ["warm"]


def test_without_a_window_arrival_order_holds():
    sched, model = pod()
    assert admitted_after_one_step(sched, model, ("cold", False), ("warm", True)) == ["cold"]


def test_below_the_threshold_arrival_order_holds():
    sched, model = pod(cache_aware_admission_window=4, cache_aware_admission_threshold=1.0)
    assert sched.kv.usage < 1.0
    assert admitted_after_one_step(sched, model, ("cold", False), ("warm", True)) == ["cold"]


def test_outside_the_window_nothing_moves():
    sched, model = pod(cache_aware_admission_window=2, cache_aware_admission_threshold=0.0)
    got = admitted_after_one_step(sched, model, ("c1", False), ("c2", False), ("warm", True))
    assert got == ["c1"]  # warm is third: past a window of two


def test_other_policies_ignore_the_window():
    sched, model = pod(cache_aware_admission_window=4, cache_aware_admission_threshold=0.0,
                       policy="priority")
    assert admitted_after_one_step(sched, model, ("cold", False), ("warm", True)) == ["cold"]


def test_only_merely_waiting_requests_swap_slots():
    q = FCFSQueue()
    reqs = {rid: request(rid, [1, 2, 3]) for rid in ("a", "p", "b", "c", "d")}
    for r in reqs.values():
        r.status = RequestStatus.WAITING
        q.add(r)
    reqs["p"].status = RequestStatus.PREEMPTED  # keeps its slot, nothing moves past it
    depth = {"a": 0, "p": 99, "b": 16, "c": 32, "d": 64}
    q.cache_aware_reorder(4, lambda r: depth[r.request_id])
    # slots 0, 2, 3 (a, b, c) reordered deepest first; d is outside the window of 4
    assert [r.request_id for r in q] == ["c", "p", "b", "a", "d"]
    q.cache_aware_reorder(4, lambda r: 0)  # ties keep the order they have
    assert [r.request_id for r in q] == ["c", "p", "b", "a", "d"]
