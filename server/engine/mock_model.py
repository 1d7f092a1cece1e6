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
  hash, and ``rolling_hash(tokens)`` recomputes it. Arithmetic mod 2^64 is what NumPy's
  uint64 does, so ``draw_ahead`` draws a whole batch's next tokens in a handful of array
  operations (the scalar ``next_token`` gives the same tokens, one request at a time; both
  computations are in `mock_draws`).
- Virtual time draws ahead: ``window`` draws the next ``LAG + 1`` tokens of the requests of a
  batch whose kept draws do not cover the steps asked for, in one NumPy pass, and keeps
  every request's (with their lag hashes) until the next such draw (``next_tokens`` draws
  and keeps the same way when several requests of a step have none); a draw at context
  length n depends only on the first n - LAG tokens, all known when it was drawn, so the
  single steps and windows that follow take their tokens from it unchanged.
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from .mock_draws import _GOLD, _M64, _SEED_MIX, LAG, _mix, draw_ahead, rolling_hash
from .request import Request
from .scheduler_config import SchedulerOutput

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

__all__ = ["LAG", "MockModel", "OutputLengths", "rolling_hash"]

CLOSE_P = 0.25  # constrained output: chance per free token that the model winds the value up
_P_CLOSE = int(CLOSE_P * (1 << 64))



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


# A window's draws kept for one request: (the request, its context length when drawn, the
# tokens drawn at that length and each one after, the lag hash behind each draw).
_Kept = tuple[Request, int, list[int], np.ndarray]


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
        # the last window's draws (`window`), by id of request: see `_Kept`
        self._kept: dict[int, _Kept] = {}

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
        if req._lag_len == target:
            return req._lag_value
        kept = self._kept.get(id(req))
        if kept is not None and kept[0] is req and n >= kept[1]:
            # a kept window's hashes: the one at this length, or its last to start from
            j = min(n - kept[1], LAG)
            start = kept[1] - LAG + j
            if start > req._lag_len or req._lag_len > target:
                req._lag_len, req._lag_value = start, int(kept[3][j])
        if req._lag_len > target:  # tokens were removed (never happens today): start over
            req._lag_len, req._lag_value = 0, 0
        if req._lag_len < target:
            req._lag_value = rolling_hash(req.token_ids[req._lag_len:target], req._lag_value)
            req._lag_len = target
        return req._lag_value

    def _kept_at(self, req: Request, n: int) -> tuple[_Kept, int] | None:
        """The kept window of `req` and the index in it of the draw at context length `n`,
        if it has one. A draw at length n is a function of the context's first n - LAG
        tokens alone, which were all known when the window was drawn (n - LAG <= the length
        then): it stays valid whatever the request appended since."""
        kept = self._kept.get(id(req))
        if kept is None or kept[0] is not req:
            return None
        j = n - kept[1]
        return (kept, j) if 0 <= j <= LAG else None

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

        Unconstrained requests past ``LAG`` tokens (nearly every decode) take the token a
        kept window drew for them (`window`); when ``_AHEAD_MIN`` or more have none, those
        are drawn ``LAG + 1`` ahead with NumPy and kept (the steps and windows that follow
        take their tokens from them), fewer one by one; the rest (a short context, a constrained
        request) one by one — the tokens are the same either way."""
        out: dict[str, list[int]] = {}
        batch: list[tuple[str, Request]] = []
        for s in output.scheduled:
            if not s.samples_token or (req := requests.get(s.request_id)) is None:
                continue
            if req.constraint is None and len(req.token_ids) > LAG:
                batch.append((s.request_id, req))
            else:
                out[s.request_id] = [self.next_token(req)]
        drawn: list[int | None] = [None] * len(batch)
        missed = []
        if self._kept:
            for i, (_, req) in enumerate(batch):
                kept = self._kept_at(req, len(req.token_ids))
                if kept is None:
                    missed.append(i)
                else:
                    drawn[i] = kept[0][2][kept[1]]
        else:
            missed = list(range(len(batch)))
        if len(missed) >= _AHEAD_MIN:  # drawn LAG + 1 ahead, kept for the steps that follow
            kept_now = {id(r): k for _, r in batch if (k := self._kept.get(id(r))) is not None}
            ahead = [batch[i][1] for i in missed]
            tokens, hashes = self.draw_ahead(ahead, LAG + 1)
            for i, req, row, h in zip(missed, ahead, tokens.tolist(), hashes, strict=True):
                drawn[i] = row[0]
                kept_now[id(req)] = (req, len(req.token_ids), row, h)
            self._kept = kept_now
        else:
            for i in missed:
                drawn[i] = self.next_token(batch[i][1])
        for (rid, _), t in zip(batch, drawn, strict=True):
            out[rid] = [t]  # type: ignore[list-item]
        return out

    def window(self, reqs: Sequence[Request], k: int, need: int | None = None
               ) -> list[list[int]]:
        """`draw_ahead`'s next tokens of each request as lists (item j: the token at step j):
        at least ``need`` (default ``k``) of them, at most ``LAG + 1``. A request whose kept
        draws cover ``need`` steps is served from them; the others are drawn, ``LAG + 1``
        from their context now, in one NumPy pass. The rows are kept until the next call,
        so the single steps in between (`next_tokens`) and the next windows take their tokens
        from them while the request's tokens are the ones drawn (a draw is a pure function of
        the context, so this changes nothing): with ``need`` the steps a window is expected
        to run, each request is drawn about once per ``LAG + 1`` steps, not once per window."""
        need = k if need is None else need
        rows: list[list[int]] = []
        missing: list[int] = []
        kept_now: dict[int, _Kept] = {}
        kept_of = self._kept.get
        for i, req in enumerate(reqs):  # `_kept_at`, inlined (a call per request per window)
            kept = kept_of(id(req))
            if kept is not None and kept[0] is req:
                j = len(req.token_ids) - kept[1]
                row = kept[2]
                if 0 <= j <= LAG and len(row) - j >= need:
                    rows.append(row[j:])
                    kept_now[id(req)] = kept
                    continue
            rows.append([])
            missing.append(i)
        if missing:
            drawn = [reqs[i] for i in missing]
            tokens, hashes = self.draw_ahead(drawn, LAG + 1)
            for i, req, row, h in zip(missing, drawn, tokens.tolist(), hashes, strict=True):
                rows[i] = row
                kept_now[id(req)] = (req, len(req.token_ids), row, h)
        self._kept = kept_now
        return rows

    def draw_ahead(self, reqs: Sequence[Request], k: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``k`` free tokens of each request (n × k), each drawn after the ones
        before it were appended, with EOS where ``next_token`` would draw it (and draws after
        an EOS as if it had not ended) — exactly ``next_token``'s tokens, without touching the
        requests beyond catching up their lag hashes; and the lag hash behind each draw
        (n × k). Every request must be unconstrained with more than ``LAG`` tokens, and
        ``k <= LAG + 1``: the hashes then cover only known tokens, so one NumPy pass draws
        the whole window (the macro-stepping of virtual time, `macro.py`; the NumPy pass is
        `mock_draws.draw_ahead`)."""
        return draw_ahead(self, reqs, k)


_AHEAD_MIN = 3  # from this many requests without kept draws, a step draws them ahead (measured)
