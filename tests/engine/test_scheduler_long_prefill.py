"""vLLM's `--long-prefill-token-threshold`: while other requests run or wait, no request gets
more than the threshold's tokens a step, so a short request behind a long prompt is not held
until that prompt's prefill ends; alone a request takes the whole budget; `adaptive` floors
the cap at the budget's fair share; without chunked prefill a prompt is never cut (vLLM
0.34.0's scheduler)."""

from __future__ import annotations

from engine_drive import make, request, run, step

LONG, SHORT = list(range(1, 1001)), list(range(2000, 2040))


def first_step(**config: object) -> dict[str, int]:
    sched, _ = make(num_blocks=1024, max_num_batched_tokens=512, **config)
    sched.add_request(request("long", LONG, 4))
    sched.add_request(request("short", SHORT, 4))
    return {s.request_id: s.num_new_tokens for s in sched.schedule().scheduled}


def test_the_threshold_caps_each_request_while_others_wait():
    assert first_step() == {"long": 512}  # off (vLLM's default): the long prompt takes it all
    assert first_step(long_prefill_token_threshold=64) == {"long": 64, "short": 40}
    # adaptive: at least 512 // 2 requests
    assert first_step(long_prefill_token_threshold=64,
                      long_prefill_token_threshold_adaptive=True) == {"long": 256, "short": 40}


def test_alone_a_request_takes_the_whole_budget():
    sched, _ = make(num_blocks=1024, max_num_batched_tokens=512, long_prefill_token_threshold=64)
    sched.add_request(request("long", LONG, 4))
    assert [s.num_new_tokens for s in sched.schedule().scheduled] == [512]


def test_without_chunked_prefill_the_threshold_cuts_no_prompt():
    sched, _ = make(num_blocks=1024, max_num_batched_tokens=1024, max_model_len=1024,
                    enable_chunked_prefill=False, long_prefill_token_threshold=32)
    sched.add_request(request("a", list(range(3000, 3060)), 4))
    sched.add_request(request("b", SHORT, 4))
    assert {s.request_id: s.num_new_tokens for s in sched.schedule().scheduled} == {
        "a": 60, "b": 40}  # whole prompts: a cut prompt would be a chunk


def first_token_step(**config: object) -> int:
    """The step at which the short request behind the long one samples its first token."""
    sched, model = make(num_blocks=1024, max_num_batched_tokens=512, **config)
    sched.add_request(request("long", LONG, 4))
    sched.add_request(request("short", SHORT, 4))
    for n in range(1, 100):
        step(sched, model)
        sched.check_integrity()
        if sched.requests["short"].num_output_tokens:
            return n
    raise AssertionError("no first token")


def test_a_short_request_behind_a_long_prompt_starts_sooner_and_outputs_are_the_same():
    assert first_token_step() == 3  # after the long prompt's two 512-token chunks
    assert first_token_step(long_prefill_token_threshold=64) == 1
    outputs = []
    for config in ({}, {"long_prefill_token_threshold": 64}):
        sched, model = make(num_blocks=1024, max_num_batched_tokens=512, **config)
        for rid, prompt in (("long", LONG), ("short", SHORT)):
            sched.add_request(request(rid, prompt, 8))
        outputs.append({rid: r.output_token_ids for rid, r in run(sched, model).items()})
    assert outputs[0] == outputs[1]  # the cap moves time, not tokens
