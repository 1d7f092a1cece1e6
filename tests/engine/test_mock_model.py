"""Mock model: tokens are a pure function of (seed, context), O(1) per token, lengths as asked."""

from __future__ import annotations

import statistics

import pytest

from server.engine.mock_model import MockModel, OutputLengths, rolling_hash
from server.engine.request import Request, SamplingParams
from server.engine.scheduler_config import ScheduledRequest, SchedulerOutput
from server.engine.tokenizer import get_tokenizer

EOS = 0


def generate(model: MockModel, prompt: list[int], max_tokens: int = 10_000, **params) -> Request:
    req = Request("r", prompt, SamplingParams(max_tokens=max_tokens, **params))
    while req.num_output_tokens < max_tokens:
        token = model.next_token(req)
        req.token_ids.append(token)
        if token == EOS and not req.sampling_params.ignore_eos:
            break
    return req


def test_rolling_hash_is_incremental_and_pure() -> None:
    tokens = list(range(50, 150))
    assert rolling_hash(tokens) == rolling_hash(tokens[60:], rolling_hash(tokens[:60]))
    model = MockModel(range(1, 100), EOS)
    req = Request("r", tokens[:10])
    for t in tokens[10:]:
        model.context_hash(req)
        req.token_ids.append(t)
    assert model.context_hash(req) == rolling_hash(tokens)
    assert req._hash_len == len(tokens)
    # A recompute from scratch (e.g. state lost on preemption) re-derives the same state.
    req._hash_len, req._hash_value = 0, 0
    assert model.context_hash(req) == rolling_hash(tokens)


def test_same_context_same_token_and_seed_matters() -> None:
    model = MockModel(range(1, 1000), EOS, OutputLengths("geometric", 1e9))
    a = generate(model, [1, 2, 3], 50)
    b = generate(model, [1, 2, 3], 50)
    assert a.output_token_ids == b.output_token_ids
    c = generate(model, [1, 2, 3], 50, seed=7)
    assert c.output_token_ids != a.output_token_ids
    d = generate(MockModel(range(1, 1000), EOS, OutputLengths("geometric", 1e9), seed=1),
                 [1, 2, 3], 50)
    assert d.output_token_ids != a.output_token_ids
    # Continuing from someone else's identical context gives the same continuation.
    e = generate(model, a.token_ids[:13], 40)
    assert e.output_token_ids == a.output_token_ids[10:]


def test_geometric_lengths_have_the_requested_mean() -> None:
    model = MockModel(range(1, 1000), EOS, OutputLengths("geometric", 20))
    lengths = [generate(model, [i, i + 1]).num_output_tokens for i in range(2000)]
    assert 18 < statistics.mean(lengths) < 22
    assert min(lengths) == 1 and max(lengths) > 60


def test_fixed_lengths_and_ignore_eos() -> None:
    model = MockModel(range(1, 1000), EOS, OutputLengths("fixed", 7))
    for i in range(20):
        req = generate(model, [i])
        assert req.num_output_tokens == 7 and req.output_token_ids[-1] == EOS
        assert EOS not in req.output_token_ids[:-1]
    req = generate(model, [1], max_tokens=30, ignore_eos=True)
    assert req.num_output_tokens == 30 and EOS not in req.output_token_ids


def test_tokens_come_from_the_tokenizer_vocabulary_without_specials() -> None:
    tok = get_tokenizer()
    model = MockModel.from_tokenizer(tok, OutputLengths("geometric", 1e9))
    req = generate(model, tok.encode("Hello"), 500, ignore_eos=True)
    assert not set(req.output_token_ids) & tok.special_token_ids
    assert all(0 <= t < tok.vocab_size for t in req.output_token_ids)
    assert model.eos_token_id == tok.eos_token_id


def test_next_tokens_samples_only_where_a_chunk_reaches_the_end() -> None:
    model = MockModel(range(1, 100), EOS)
    reqs = {"a": Request("a", [1] * 8), "b": Request("b", [2] * 8)}
    out = SchedulerOutput((ScheduledRequest("a", 8, 0, True, True),
                           ScheduledRequest("b", 4, 0, True, False)))
    tokens = model.next_tokens(out, reqs)
    assert list(tokens) == ["a"] and len(tokens["a"]) == 1


def test_output_lengths_validation() -> None:
    with pytest.raises(ValueError):
        OutputLengths("poisson", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        OutputLengths("fixed", 0)


@pytest.mark.parametrize("kind", ["geometric", "fixed"])
def test_a_batch_draws_the_same_tokens_as_one_at_a_time(kind) -> None:
    """The vectorised draw over a batch of decodes (NumPy, wrapping uint64) is exactly the
    scalar draw, EOS decisions included (ignore_eos, min_tokens, both length laws)."""
    model = MockModel(range(1, 5000), EOS, OutputLengths(kind, 6), seed=3)

    def fleet() -> list[Request]:
        reqs = []
        for i in range(40):
            params = dict(ignore_eos=i % 3 == 0, min_tokens=i % 4, seed=i * 7919)
            req = Request(f"r{i}", [i + 1, 2 * i + 3, 9], SamplingParams(max_tokens=50, **params))
            model.context_hash(req)
            req.token_ids.append(100 + i)  # a decode: the hash is one token behind
            reqs.append(req)
        return reqs

    batch, single = fleet(), fleet()
    out = SchedulerOutput(tuple(ScheduledRequest(r.request_id, 1, r.num_tokens - 1, False, True)
                                for r in batch))
    for _ in range(8):  # several steps: EOS and lengths come into play
        drawn = model.next_tokens(out, {r.request_id: r for r in batch})
        one = {r.request_id: [model.next_token(r)] for r in single}
        assert drawn == one
        assert [r._hash_value for r in batch] == [r._hash_value for r in single]
        for reqs, tokens in ((batch, drawn), (single, one)):
            for r in reqs:
                r.token_ids.append(tokens[r.request_id][0])
    assert sum(EOS in t for t in drawn.values()) > 0  # some ended: EOS decisions compared
