"""Scheduler behaviour driven directly with the mock model: determinism across cache, preemption
and batching; prefix-cache savings; paged vs contiguous capacity; policies; abort."""

from __future__ import annotations

import random
import zlib

import pytest
from engine_drive import make, request, run, step

from server.engine.mock_model import OutputLengths
from server.engine.request import FinishReason, RequestStatus
from server.engine.scheduler import Scheduler


def shared_prefix_workload(
    groups: int = 4, users: int = 6, system_len: int = 256, user_len: int = 20, seed: int = 0
) -> list[tuple[str, list[int]]]:
    rng = random.Random(seed)
    systems = [[rng.randrange(1, 1000) for _ in range(system_len)] for _ in range(groups)]
    out = []
    for u in range(users):
        for g in range(groups):
            # Distinct first user token per request, so prompts diverge right after the prefix.
            user = [1 + (g * users + u) % 999]
            user += [rng.randrange(1, 1000) for _ in range(user_len - 1)]
            out.append((f"g{g}u{u}", systems[g] + user))
    return out


def outputs(sched: Scheduler, model, workload, max_tokens: int = 48, **run_kw) -> dict:
    for rid, prompt in workload:
        sched.add_request(request(rid, prompt, max_tokens, seed=zlib.crc32(rid.encode()) % 7))
    done = run(sched, model, **run_kw)
    assert len(done) == len(workload)
    assert sched.pool.num_used == sched.cache.cached_blocks  # idle: only the cache holds KV
    return {rid: (r.output_token_ids, r.finish_reason) for rid, r in done.items()}


CONFIGS = {
    "baseline": dict(num_blocks=1024),
    "no-cache": dict(num_blocks=1024, enable_prefix_caching=False),
    "tiny-pool": dict(num_blocks=20),  # preempts
    "tiny-pool-no-cache": dict(num_blocks=17, enable_prefix_caching=False),
    "small-steps": dict(num_blocks=1024, max_num_batched_tokens=24, max_num_seqs=3),
    "lpm": dict(num_blocks=30, policy="lpm"),
    "priority": dict(num_blocks=30, policy="priority"),
    "no-chunking": dict(num_blocks=200, enable_chunked_prefill=False, max_model_len=2048,
                        max_num_batched_tokens=2048),
    "contiguous-static": dict(num_blocks=60, kv_layout="contiguous", batching="static"),
    "paged-static": dict(num_blocks=60, batching="static"),
}


def test_outputs_identical_across_cache_preemption_and_batching() -> None:
    workload = shared_prefix_workload(groups=3, users=6, system_len=100)
    results, preemptions = {}, {}
    for name, cfg in CONFIGS.items():
        sched, model = make(**cfg)  # type: ignore[arg-type]
        results[name] = outputs(sched, model, workload)
        preemptions[name] = sched.stats.num_preemptions
    for name, res in results.items():
        assert res == results["baseline"], name
    assert preemptions["tiny-pool"] > 0 and preemptions["tiny-pool-no-cache"] > 0
    assert preemptions["baseline"] == 0
    # Not every request ends by length: the EOS distribution is in play.
    reasons = {reason for _, reason in results["baseline"].values()}
    assert reasons == {FinishReason.STOP, FinishReason.LENGTH}


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_outputs_identical_with_forced_preemption(prefix_caching: bool) -> None:
    workload = shared_prefix_workload(groups=2, users=3, system_len=64)
    ref_sched, model = make(num_blocks=512, enable_prefix_caching=prefix_caching)
    reference = outputs(ref_sched, model, workload)

    def preempt_some(sched: Scheduler, n: int) -> None:
        if n % 3 == 0 and sched.running:
            sched.preempt(sched.running[n % len(sched.running)].request_id)

    sched, model = make(num_blocks=512, enable_prefix_caching=prefix_caching)
    assert outputs(sched, model, workload, before_step=preempt_some) == reference
    assert sched.stats.num_preemptions > 5
    assert sched.stats.num_prefill_tokens > ref_sched.stats.num_prefill_tokens  # recomputed


def test_shared_prefix_prefills_far_less_and_cached_counts_are_exact() -> None:
    groups, users, system_len, user_len = 4, 6, 256, 20
    workload = shared_prefix_workload(groups, users, system_len, user_len)
    prompt_len = system_len + user_len

    on, model = make(num_blocks=1024)
    for rid, prompt in workload:
        on.add_request(request(rid, prompt, 8))
    done_on = run(on, model)
    off, model = make(num_blocks=1024, enable_prefix_caching=False)
    for rid, prompt in workload:
        off.add_request(request(rid, prompt, 8))
    run(off, model)

    # All arrive at once; the first of each group prefills everything, the others only their
    # own part (the system prompt is 16 whole blocks, shared within the same step).
    assert on.stats.num_prefill_tokens == groups * prompt_len + groups * (users - 1) * user_len
    assert off.stats.num_prefill_tokens == groups * users * prompt_len
    assert off.stats.num_prefill_tokens > 4 * on.stats.num_prefill_tokens
    for rid, r in done_on.items():
        assert r.num_cached_tokens == (0 if rid.endswith("u0") else system_len), rid
    assert on.stats.prefix_cache_hits == groups * (users - 1) * system_len
    assert on.stats.prefix_cache_queries == groups * users * prompt_len

    # A second wave after the first finished: cached up to the block boundary of the prefix.
    second = shared_prefix_workload(groups, 2, system_len, user_len, seed=0)
    for rid, prompt in second:
        on.add_request(request("again-" + rid, prompt[: system_len + 5] + [7] * 10, 8))
    done = run(on, model)
    # Same prompt up to system_len + 5 tokens as a first-wave request: 16 blocks + 0 (the
    # 17th block of the first wave's request has only 5 tokens in common).
    assert all(r.num_cached_tokens == system_len for r in done.values())


def test_paged_continuous_fits_max_len_over_mean_len_more_requests() -> None:
    # 256 blocks of 16 tokens. Every request: 24-token prompt, up to 232 output tokens
    # (max length 256 = 16 blocks), but it actually stops after 8 (mean length 32 = 2 blocks).
    lengths = OutputLengths("fixed", 8)
    peaks, steps = {}, {}
    for name, cfg in {
        "paged-continuous": dict(kv_layout="paged", batching="continuous"),
        "contiguous-static": dict(kv_layout="contiguous", batching="static"),
    }.items():
        sched, model = make(lengths, num_blocks=256, **cfg)  # type: ignore[arg-type]
        for i in range(400):
            sched.add_request(request(f"r{i}", [1 + (i + j) % 999 for j in range(24)], 232))
        done = run(sched, model)
        assert all(r.num_output_tokens == 8 for r in done.values())
        peaks[name], steps[name] = sched.stats.peak_num_running, sched.stats.num_steps
    assert peaks["contiguous-static"] == 256 // 16
    assert peaks["paged-continuous"] == 256 // 2
    assert peaks["paged-continuous"] / peaks["contiguous-static"] == 256 / 32  # max ÷ mean
    assert steps["paged-continuous"] * 4 < steps["contiguous-static"]  # and more tokens per step


def test_paged_vs_contiguous_with_geometric_lengths() -> None:
    lengths = OutputLengths("geometric", 16)
    peaks = {}
    for layout, batching in (("paged", "continuous"), ("contiguous", "static")):
        sched, model = make(lengths, num_blocks=512, kv_layout=layout, batching=batching)
        for i in range(600):
            sched.add_request(request(f"r{i}", [1 + (3 * i + j) % 999 for j in range(16)], 240))
        run(sched, model, check=False)
        peaks[layout] = sched.stats.peak_num_running
    ratio = peaks["paged"] / peaks["contiguous"]
    expected = 256 / (16 + 16)  # max length ÷ mean length
    assert expected / 2 < ratio < expected * 2, (peaks, expected)


def test_abort_frees_everything_at_once_in_any_state() -> None:
    sched, model = make(num_blocks=64, max_num_seqs=2, max_num_batched_tokens=32)
    prompt = list(range(1, 41))
    for i in range(4):
        sched.add_request(request(f"r{i}", prompt, 100, ignore_eos=True))
    step(sched, model)
    step(sched, model)
    assert sched.preempt("r1")
    states = {rid: r.status for rid, r in sched.requests.items()}
    assert set(states.values()) == {RequestStatus.RUNNING, RequestStatus.WAITING,
                                    RequestStatus.PREEMPTED}
    for rid in list(sched.requests):
        req = sched.abort(rid)
        assert req is not None and req.status == RequestStatus.FINISHED_ABORTED
        assert not req.block_ids and req.cache_node is None
        sched.check_integrity()
    assert sched.abort("r0") is None and sched.abort("nope") is None
    assert not sched.has_unfinished()
    assert sched.pool.num_used == sched.cache.cached_blocks
    assert sched.kv.usage == 0.0


def test_abort_between_schedule_and_update_is_skipped() -> None:
    sched, model = make(num_blocks=64)
    sched.add_request(request("a", [5] * 20, 4))
    sched.add_request(request("b", [6] * 20, 4))
    out = sched.schedule()
    tokens = model.next_tokens(out, sched.requests)
    sched.abort("a")
    finished = sched.update(out, tokens)
    assert finished == [] and sched.requests["b"].num_output_tokens == 1
    sched.check_integrity()


def test_preempted_request_goes_to_the_front_and_newest_is_the_victim() -> None:
    # 8 blocks of 16: two requests of 48 prompt tokens (3 blocks each) + decodes.
    sched, model = make(num_blocks=8, enable_prefix_caching=False)
    sched.add_request(request("old", [1] * 48, 64, ignore_eos=True))
    sched.add_request(request("new", [2] * 48, 64, ignore_eos=True))
    sched.add_request(request("later", [3] * 40, 4, ignore_eos=True))
    out = sched.schedule()
    assert [s.request_id for s in out.scheduled] == ["old", "new"]  # "later" finds no block
    sched.update(out, model.next_tokens(out, sched.requests))
    preempted_at = None
    for n in range(64):
        out = sched.schedule()
        if out.preempted_request_ids:
            preempted_at = n
            break
        sched.update(out, model.next_tokens(out, sched.requests))
    assert preempted_at is not None and out.preempted_request_ids == ("new",)
    assert next(iter(sched.waiting)).request_id == "new"
    assert sched.requests["new"].status == RequestStatus.PREEMPTED
    assert sched.stats.num_preemptions == 1


def test_priority_policy_admits_lowest_value_first() -> None:
    sched, model = make(num_blocks=64, policy="priority", max_num_seqs=1)
    for rid, prio in (("low", 5), ("high", -1), ("mid", 0)):
        sched.add_request(request(rid, [4] * 8, 2, ignore_eos=True, priority=prio))
    order = []
    while sched.has_unfinished():
        order += [r.request_id for r in step(sched, model)]
    assert order == ["high", "mid", "low"]


def test_lpm_policy_prefers_the_longest_cached_prefix() -> None:
    sched, model = make(num_blocks=256, policy="lpm", max_num_seqs=1)
    cached = list(range(100, 164))
    sched.add_request(request("warm", [*cached, 1], 1))
    run(sched, model)
    sched.add_request(request("cold", list(range(500, 565)), 1))
    sched.add_request(request("hot", [*cached, 2, 3], 1))
    order = []
    while sched.has_unfinished():
        order += [r.request_id for r in step(sched, model)]
    assert order == ["hot", "cold"]


def test_schedule_output_shapes() -> None:
    sched, model = make(num_blocks=64, max_num_batched_tokens=40)
    sched.add_request(request("a", list(range(1, 31)), 4, ignore_eos=True))
    sched.add_request(request("b", list(range(40, 70)), 4, ignore_eos=True))
    out = sched.schedule()
    assert out.prefill_segments == [(30, 0), (10, 0)]  # b is chunked
    assert [s.samples_token for s in out.scheduled] == [True, False]
    sched.update(out, model.next_tokens(out, sched.requests))
    out = sched.schedule()
    assert out.decode_context_lengths == [31]
    assert out.prefill_segments == [(20, 10)]
    assert out.num_batched_tokens == 21


def test_static_batching_admits_only_when_idle() -> None:
    sched, model = make(num_blocks=256, batching="static", max_num_seqs=2)
    for i in range(3):
        sched.add_request(request(f"r{i}", [i + 1] * 8, 3 + 5 * i, ignore_eos=True))
    step(sched, model)
    assert sched.num_running == 2
    while sched.requests.get("r1") is not None:
        step(sched, model)
        # r0 finished early, but r2 waits for the whole batch to end.
        assert sched.num_waiting == 1 or sched.requests.get("r1") is None
    step(sched, model)
    assert sched.num_running == 1


def test_add_request_rejects_what_could_never_run() -> None:
    sched, _ = make(num_blocks=4, max_model_len=512)
    with pytest.raises(ValueError, match="max_model_len"):
        sched.add_request(request("long", [1] * 512, 1))
    with pytest.raises(ValueError, match="KV blocks"):
        sched.add_request(request("big", [1] * 100, 1))
    sched.add_request(request("ok", [1] * 10, 4))
    with pytest.raises(ValueError, match="duplicate"):
        sched.add_request(request("ok", [1] * 10, 4))


def test_priority_victim_already_scheduled_this_step_is_undone() -> None:
    # 3 blocks of 16. "bulk" (priority 5) arrived first, "vip" (priority 0) second; both
    # need a second block at their first decode, and only one is free.
    sched, model = make(num_blocks=3, policy="priority", enable_prefix_caching=False)
    sched.add_request(request("bulk", [1] * 16, 8, ignore_eos=True, priority=5))
    sched.add_request(request("vip", [2] * 16, 8, ignore_eos=True, priority=0))
    step(sched, model)
    assert [r.request_id for r in sched.running] == ["vip", "bulk"]  # admitted by priority
    sched.running.reverse()  # make the victim come first in the running order
    out = sched.schedule()
    assert out.preempted_request_ids == ("bulk",)
    assert [s.request_id for s in out.scheduled] == ["vip"]
    assert out.num_batched_tokens == 1
    sched.update(out, model.next_tokens(out, sched.requests))
    sched.check_integrity()
    done = run(sched, model)
    assert set(done) == {"bulk", "vip"}


def test_fragmentation_is_measurable() -> None:
    frag = {}
    for layout in ("paged", "contiguous"):
        sched, model = make(OutputLengths("fixed", 4), num_blocks=64, kv_layout=layout)
        sched.add_request(request("a", [1] * 20, 200))
        step(sched, model)
        frag[layout] = sched.kv.fragmentation(sched.running)
    assert frag["paged"] == 1 - 20 / 32  # 20 tokens in 2 blocks
    assert frag["contiguous"] == 1 - 20 / (14 * 16)  # 220 tokens reserved: 14 blocks
