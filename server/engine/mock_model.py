"""A deterministic mock language model: the next token is a pure function of (seed, context).

Contract:
- ``next_token(req)`` depends only on the model seed, the request's sampling seed and
  ``req.token_ids`` — never on batching, cache hits, preemption or wall time. A cache bug (KV
  reused for the wrong prefix) therefore cannot change tokens by itself, but any scheduler bug
  that corrupts a request's token sequence shows up as different output.
- Cost O(1) per token: the context enters through a polynomial rolling hash
  ``h(t_1..t_n) = Σ (t_i + 1)·B^(n-i) mod 2^64`` kept on the request and extended by the
  tokens appended since the last call; the draw mixes it with splitmix64. It is a pure
  function of the token sequence, so a recomputed request (after preemption) has the same
  hash, and ``rolling_hash(tokens)`` recomputes it. Arithmetic mod 2^64 is what NumPy's uint64
  does, so ``next_tokens`` draws a whole batch's decodes in a handful of array operations
  (the scalar ``next_token`` gives the same tokens, one request at a time).
- Output lengths: unless ``ignore_eos``, EOS is drawn with the configured distribution —
  ``geometric`` (each output position ends with probability 1/mean, so lengths, EOS included,
  have that mean) or ``fixed`` (exactly ``mean`` tokens, the last being EOS). Other tokens are
  drawn uniformly from ``vocab_ids`` (from a tokenizer: its ``free_text_token_ids``, whole
  " word" tokens, so the text re-tokenizes to exactly the generated ids).
- Constrained requests (``req.constraint`` set) draw only tokens the grammar allows (see
  ``constraints.ConstraintState.next_token``), from the same hash. The length distribution
  does not apply: at each free position the model "winds down" with probability
  ``CLOSE_P`` (free values then run about 1/CLOSE_P tokens), and always in the second half of
  ``max_tokens``, preferring EOS (only where the grammar accepts) and closing punctuation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from .request import Request
from .scheduler_config import SchedulerOutput

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

_B = 0x100000001B3  # base: odd, so the hash is a bijection of the last token mod 2^64
_M64 = (1 << 64) - 1
_SEED_MIX = 0x100000001B3
_GOLD = 0x9E3779B97F4A7C15  # spreads the context length into a lagged draw
# Free tokens depend on the context but its last LAG tokens (once it is longer than LAG): the
# next LAG draws of a decode need no token drawn among them, so a window of decode steps is
# drawn in one vectorised pass (`draw_ahead`). Any function of the context is a valid model.
LAG = 32
_B_POW = np.array([pow(_B, j, 1 << 64) for j in range(LAG + 2)], np.uint64)
_B_INV = np.array([pow(_B, -j, 1 << 64) for j in range(LAG + 2)], np.uint64)
_STEPS = np.arange(LAG + 2, dtype=np.int64)
CLOSE_P = 0.25  # constrained output: chance per free token that the model winds the value up
_P_CLOSE = int(CLOSE_P * (1 << 64))


def rolling_hash(token_ids: Iterable[int], value: int = 0) -> int:
    """Extend a rolling hash ``value`` by ``token_ids`` (start from 0 for the empty context).
    A long list (a prompt) is hashed with NumPy: Σ (t_i + 1)·B^(n-1-i) + value·B^n, wrapping
    uint64 arithmetic being arithmetic mod 2^64 — the same value as the loop."""
    if isinstance(token_ids, list) and len(token_ids) > _NP_HASH_MIN:
        n = len(token_ids)
        powers = _powers(n)
        with np.errstate(over="ignore"):
            terms = (np.array(token_ids, np.uint64) + np.uint64(1)) * powers[n - 1::-1]
            total = int(terms.sum(dtype=np.uint64))
        return (total + value * int(powers[n])) & _M64 if value else total
    for t in token_ids:
        value = (value * _B + t + 1) & _M64
    return value


_NP_HASH_MIN = 96
_POWERS: list[np.ndarray] = [np.ones(1, np.uint64)]


def _powers(n: int) -> np.ndarray:
    """B^0 .. B^n mod 2^64 (grown on demand, kept)."""
    have = _POWERS[0]
    if len(have) <= n:
        size = max(n + 1, 2 * len(have))
        out = [1] * size
        for i in range(1, size):
            out[i] = (out[i - 1] * _B) & _M64
        _POWERS[0] = have = np.array(out, np.uint64)
    return have


def _mix(x: int) -> int:
    """splitmix64 finaliser: a well-spread 64-bit value from any integer."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


@dataclass(frozen=True, slots=True)
class OutputLengths:
    """How many tokens a request generates before EOS (when it does not ignore EOS)."""

    kind: Literal["geometric", "fixed"] = "geometric"
    mean: float = 128.0

    def __post_init__(self) -> None:
        if self.kind not in ("geometric", "fixed"):
            raise ValueError(f"unknown output length distribution {self.kind!r}")
        if self.mean < 1:
            raise ValueError(f"mean output length must be >= 1, got {self.mean}")


class MockModel:
    def __init__(
        self,
        vocab_ids: Sequence[int],
        eos_token_id: int,
        lengths: OutputLengths | None = None,
        seed: int = 0,
    ) -> None:
        self.vocab_ids = [t for t in vocab_ids if t != eos_token_id]
        if not self.vocab_ids:
            raise ValueError("the mock model needs at least one non-EOS token")
        self.eos_token_id = eos_token_id
        self.lengths = lengths or OutputLengths()
        self.seed = seed
        self._p_eos = min(_M64, int((1.0 / self.lengths.mean) * (1 << 64)))
        self._vocab_np = np.asarray(self.vocab_ids, dtype=np.int64)

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Tokenizer, lengths: OutputLengths | None = None, seed: int = 0
    ) -> MockModel:
        """Draw free text from the tokenizer's " word" tokens; its EOS ends requests."""
        return cls(tokenizer.free_text_token_ids, tokenizer.eos_token_id, lengths, seed)

    def context_hash(self, req: Request) -> int:
        """The rolling hash of ``req.token_ids``, caught up incrementally."""
        n = req.num_tokens
        if req._hash_len > n:  # tokens were removed (never happens today): start over
            req._hash_len, req._hash_value = 0, 0
        if req._hash_len < n:
            req._hash_value = rolling_hash(req.token_ids[req._hash_len :], req._hash_value)
            req._hash_len = n
        return req._hash_value

    def lag_hash(self, req: Request) -> int:
        """The hash a free (unconstrained) draw uses: of the whole context while it has at
        most ``LAG`` tokens, then of all of it but its last ``LAG`` tokens (kept on the request
        as ``_lag_len``/``_lag_value``, caught up incrementally)."""
        n = len(req.token_ids)
        if n <= LAG:
            return self.context_hash(req)
        target = n - LAG
        if req._lag_len > target:  # tokens were removed (never happens today): start over
            req._lag_len, req._lag_value = 0, 0
        if req._lag_len < target:
            req._lag_value = rolling_hash(req.token_ids[req._lag_len:target], req._lag_value)
            req._lag_len = target
        return req._lag_value

    def _free_draw(self, h: int, n: int, seed: int) -> int:
        """The 64-bit draw of a free token at context length ``n`` from its ``lag_hash``."""
        if n > LAG:
            h = (h + n * _GOLD) & _M64
        return _mix(_mix(h ^ ((self.seed * _SEED_MIX) & _M64)) ^ (seed & _M64))

    def next_token(self, req: Request) -> int:
        sp = req.sampling_params
        if req.constraint is not None:
            h = self.context_hash(req)
            r = _mix(_mix(h ^ ((self.seed * _SEED_MIX) & _M64)) ^ (sp.seed & _M64))
            closing = (_mix(r ^ 0xC105E) < _P_CLOSE
                       or 2 * req.num_output_tokens >= sp.max_tokens)
            return req.constraint.next_token(r, closing)
        r = self._free_draw(self.lag_hash(req), len(req.token_ids), sp.seed)
        if not sp.ignore_eos and req.num_output_tokens >= sp.min_tokens:
            if self.lengths.kind == "fixed":
                if req.num_output_tokens + 1 >= self.lengths.mean:
                    return self.eos_token_id
            elif _mix(r ^ 0x5EED) < self._p_eos:
                return self.eos_token_id
        return self.vocab_ids[r % len(self.vocab_ids)]

    def next_tokens(
        self, output: SchedulerOutput, requests: Mapping[str, Request]
    ) -> dict[str, list[int]]:
        """One token for each scheduled request whose chunk reached its last known token.

        Unconstrained requests past ``LAG`` tokens (nearly every decode) are drawn together
        with NumPy; the rest (a short context, a constrained request) one by one — the
        tokens are the same either way."""
        out: dict[str, list[int]] = {}
        batch: list[tuple[str, Request]] = []
        for s in output.scheduled:
            if not s.samples_token or (req := requests.get(s.request_id)) is None:
                continue
            if req.constraint is None and len(req.token_ids) > LAG:
                batch.append((s.request_id, req))
            else:
                out[s.request_id] = [self.next_token(req)]
        if len(batch) >= _VECTOR_MIN:
            out.update(self._draw_batch(batch))
        else:
            for rid, req in batch:
                out[rid] = [self.next_token(req)]
        return out

    def _draw_batch(self, batch: list[tuple[str, Request]]) -> dict[str, list[int]]:
        reqs = [r for _, r in batch]
        tokens = self.draw_ahead(reqs, 1)[0][:, 0]
        return {rid: [t] for (rid, _), t in zip(batch, tokens.tolist(), strict=True)}

    def draw_ahead(self, reqs: Sequence[Request], k: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``k`` free tokens of each request (n × k), each drawn after the ones
        before it were appended, with EOS where ``next_token`` would draw it (and draws after
        an EOS as if it had not ended) — exactly ``next_token``'s tokens, without touching the
        requests beyond catching up their lag hashes; and the lag hash behind each draw
        (n × k). Every request must be unconstrained with more than ``LAG`` tokens, and
        ``k <= LAG + 1``: the hashes then cover only known tokens, so one NumPy pass draws
        the whole window (the macro-stepping of virtual time, `macro.py`)."""
        n = len(reqs)
        if not 1 <= k <= LAG + 1:
            raise ValueError(f"draw_ahead draws 1..{LAG + 1} tokens, not {k}")
        h0 = np.fromiter(map(self.lag_hash, reqs), np.uint64, n)
        seeds = np.fromiter((r.sampling_params.seed & _M64 for r in reqs), np.uint64, n)
        lens, prompts, mins, may = np.array(
            [(len(r.token_ids), r.num_prompt_tokens, r.sampling_params.min_tokens,
              not r.sampling_params.ignore_eos) for r in reqs], np.int64).reshape(n, 4).T
        with np.errstate(over="ignore"):
            if k > 1:  # H(tokens[:S + j]) = B^j (H(tokens[:S]) + sum_{i<j} (t_{S+i}+1) B^-(i+1))
                older = np.array([r.token_ids[r._lag_len:r._lag_len + k - 1] for r in reqs],
                                 np.uint64).reshape(n, k - 1)
                acc = np.zeros((n, k), np.uint64)
                np.cumsum((older + np.uint64(1)) * _B_INV[1:k], axis=1, out=acc[:, 1:])
                h = (h0[:, None] + acc) * _B_POW[:k]
            else:
                h = h0[:, None]
            pos = lens[:, None] + _STEPS[:k]  # the context length at each draw
            x = h + pos.astype(np.uint64) * np.uint64(_GOLD)
            r = _mix_np(_mix_np(x ^ np.uint64((self.seed * _SEED_MIX) & _M64)) ^ seeds[:, None])
            tokens = self._vocab_np[r % np.uint64(len(self.vocab_ids))]
            outs = pos - prompts[:, None]
            eos_ok = (may[:, None] != 0) & (outs >= mins[:, None])
            if eos_ok.any():
                if self.lengths.kind == "fixed":
                    stop = eos_ok & (outs + 1 >= self.lengths.mean)
                else:
                    stop = eos_ok & (_mix_np(r ^ np.uint64(0x5EED)) < np.uint64(self._p_eos))
                tokens = np.where(stop, self.eos_token_id, tokens)
        return tokens, h


_VECTOR_MIN = 8  # below this many decodes, the scalar path is faster than NumPy's overhead


_C0, _C1, _C2 = (np.uint64(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9,
                                         0x94D049BB133111EB))
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _mix_np(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping multiplication, as `_mix`)."""
    x = x + _C0
    x = (x ^ (x >> _S30)) * _C1
    x = (x ^ (x >> _S27)) * _C2
    return x ^ (x >> _S31)
