"""The mock model's lagged free draws (contexts longer than LAG): a whole window of a batch's
next tokens in one NumPy pass (`draw_ahead`) is exactly the scalar draws one after the other,
and the tokens are still a pure function of the context."""

from __future__ import annotations

import pytest

from server.engine.mock_model import LAG, MockModel, OutputLengths
from server.engine.request import Request, SamplingParams
from server.engine.scheduler_config import ScheduledRequest, SchedulerOutput

EOS = 0


def _fleet(n: int = 24) -> list[Request]:
    reqs = []
    for i in range(n):
        params = SamplingParams(max_tokens=400, ignore_eos=i % 3 == 0, min_tokens=i % 5,
                                seed=i * 7919)
        reqs.append(Request(f"r{i}", [(i * 31 + j) % 900 + 1 for j in range(LAG + 3 * i)],
                            params))
    return reqs


@pytest.mark.parametrize("kind", ["geometric", "fixed"])
def test_draw_ahead_is_the_scalar_draws_in_sequence(kind):
    model = MockModel(range(1, 5000), EOS, OutputLengths(kind, 12), seed=5)
    batch, single = _fleet(), _fleet()
    for r in batch + single:
        r.token_ids.append(7)  # a decode's context: more than LAG tokens
    tokens, _ = model.draw_ahead(batch, LAG + 1)
    for i, req in enumerate(single):
        drawn = []
        for _ in range(LAG + 1):
            t = model.next_token(req)
            drawn.append(t)
            req.token_ids.append(t)
        assert tokens[i].tolist() == drawn
    assert (tokens == EOS).any()  # EOS decisions were compared too
    with pytest.raises(ValueError):
        model.draw_ahead(batch, LAG + 2)


def test_a_long_batch_draws_the_same_tokens_as_one_at_a_time():
    """`next_tokens`' vectorised path for long contexts (the lag hash caught up one token per
    step) gives the scalar tokens step after step."""
    model = MockModel(range(1, 5000), EOS, OutputLengths("geometric", 1e9), seed=2)
    batch, single = _fleet(), _fleet()
    for r in batch + single:
        r.token_ids.append(3)
    out = SchedulerOutput(tuple(ScheduledRequest(r.request_id, 1, r.num_tokens - 1, False, True)
                                for r in batch))
    for _ in range(LAG + 5):
        drawn = model.next_tokens(out, {r.request_id: r for r in batch})
        one = {r.request_id: [model.next_token(r)] for r in single}
        assert drawn == one
        for reqs, tokens in ((batch, drawn), (single, one)):
            for r in reqs:
                r.token_ids.append(tokens[r.request_id][0])


def test_lagged_tokens_depend_on_the_whole_context_but_its_last_lag_tokens():
    model = MockModel(range(1, 5000), EOS, OutputLengths("geometric", 1e9))

    def continuation(prompt: list[int]) -> list[int]:
        req = Request("r", prompt, SamplingParams(max_tokens=80, ignore_eos=True))
        for _ in range(80):
            req.token_ids.append(model.next_token(req))
        return req.output_token_ids

    base = list(range(1, 2 * LAG + 1))
    a = continuation(base)
    assert continuation(list(base)) == a  # pure
    changed = continuation([999, *base[1:]])  # the first token differs
    assert changed != a and changed[:LAG] != a[:LAG]
    # the same context reached another way continues the same
    assert continuation(base + a[:10]) == a[10:] + continuation(base + a)[:10]


def test_a_kept_window_serves_the_scalar_tokens_to_later_steps_and_windows():
    """`window` keeps each request's draws: the single steps after it (`next_tokens`) and a
    window it covers take their tokens from them — the scalar draws all the same — and a
    window it does not cover draws again; a step past them draws them ahead, kept too."""
    model = MockModel(range(1, 5000), EOS, OutputLengths("geometric", 40), seed=9)
    scalar = MockModel(range(1, 5000), EOS, OutputLengths("geometric", 40), seed=9)
    batch, single = _fleet(12), _fleet(12)
    for r in batch + single:
        r.token_ids.append(7)
    rows = model.window(batch, 5)
    assert all(len(row) == LAG + 1 for row in rows)  # drawn LAG + 1 ahead, kept
    calls = []
    for name in ("draw_ahead", "next_token"):
        fn = getattr(model, name)
        setattr(model, name, lambda *a, fn=fn, name=name: calls.append(name) or fn(*a))
    out = SchedulerOutput(tuple(ScheduledRequest(r.request_id, 1, r.num_tokens - 1, False, True)
                                for r in batch))
    for step in range(LAG + 3):
        if step == 4:  # covered for 10 more steps: nothing drawn
            again = model.window(batch, 10)
            assert [row[:10] for row in again] == [row[4:14] for row in rows]
        tokens = model.next_tokens(out, {r.request_id: r for r in batch})
        one = {r.request_id: [scalar.next_token(r)] for r in single}
        assert tokens == one
        assert [model.lag_hash(r) for r in batch] == [scalar.lag_hash(r) for r in single]
        if step <= LAG:  # all from the kept draws
            assert calls == []
            assert tokens == {r.request_id: [row[step]] for r, row in zip(batch, rows, strict=True)}
        for reqs, toks in ((batch, tokens), (single, one)):
            for r in reqs:
                r.token_ids.append(toks[r.request_id][0])
    assert calls == ["draw_ahead"]  # past the kept draws: all drawn ahead at once, and kept
    calls.clear()
    model.window(batch, 2)
    assert calls == []  # covered by the draws of that step
    model.window(batch, LAG + 1)
    assert calls == ["draw_ahead"]  # not covered any more: all drawn again, at once


def test_a_window_draws_only_the_requests_its_kept_draws_do_not_cover_for_need_steps():
    """`window(reqs, k, need)`: a request kept for `need` steps is served from its kept draws
    (shorter than `k`: the window stops there), one kept for fewer is drawn afresh, alone,
    and every row is still the scalar tokens."""
    model = MockModel(range(1, 5000), EOS, OutputLengths("geometric", 40), seed=4)
    scalar = MockModel(range(1, 5000), EOS, OutputLengths("geometric", 40), seed=4)
    batch, single = _fleet(6), _fleet(6)
    for r in batch + single:
        r.token_ids.append(7)
    first = model.window(batch, LAG + 1)
    for reqs, rows in ((batch, first), (single, first)):  # 20 steps on: 13 kept draws left
        for r, row in zip(reqs, rows, strict=True):
            r.token_ids.extend(row[:20])
    late = _fleet(1)[0]  # a request with no kept draws
    late.token_ids.append(9)
    drawn: list[int] = []
    draw = model.draw_ahead
    model.draw_ahead = lambda reqs, k: drawn.append(len(reqs)) or draw(reqs, k)
    rows = model.window([*batch, late], LAG + 1, need=10)
    assert drawn == [1]  # only the late request
    assert [len(row) for row in rows] == [LAG + 1 - 20] * 6 + [LAG + 1]
    rows = model.window(batch, LAG + 1, need=14)  # 13 left: all drawn again, together
    assert drawn == [1, 6] and all(len(row) == LAG + 1 for row in rows)
    for r, row in zip(single, rows, strict=True):
        ahead = []
        for _ in range(LAG + 1):
            ahead.append(scalar.next_token(r))
            r.token_ids.append(ahead[-1])
        assert row == ahead
