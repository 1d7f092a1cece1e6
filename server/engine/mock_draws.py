"""The mock model's arithmetic (see `mock_model`'s contract): the rolling hash of a context,
splitmix64 (on Python ints and on NumPy arrays), and `draw_ahead`, the next ``LAG + 1`` free
tokens of a whole batch in one NumPy pass.

Why it exists apart from `mock_model`: `MockModel` decides which token a request gets and
when (scalar draws, constrained output, the draws it keeps for later steps); this module is
the numbers behind those decisions, the same function of the context in scalar and in
vectorised form, so the two can be read (and tested) against each other.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .request import Request

if TYPE_CHECKING:
    from .mock_model import MockModel

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


def rolling_hash(token_ids: Iterable[int], value: int = 0) -> int:
    """Extend a rolling hash ``value`` by ``token_ids`` (start from 0 for the empty context).
    A long list (a prompt) is hashed with NumPy: Σ (t_i + 1)·B^(n-1-i) + value·B^n, wrapping
    uint64 arithmetic being arithmetic mod 2^64 — the same value as the loop."""
    if isinstance(token_ids, list) and len(token_ids) > _NP_HASH_MIN:
        n = len(token_ids)
        powers = _powers(n)
        # uint64 dot products wrap: the sum mod 2^64
        total = int(np.dot(_u64(token_ids) + np.uint64(1), powers[n - 1::-1]))
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


def _u64(values: list[int]) -> np.ndarray:
    """A uint64 array of `values` (all in 0 .. 2^64 - 1): through `array.array`, several
    times faster than `np.array` on a list of Python ints."""
    return np.frombuffer(array("Q", values), np.uint64)


def _mix(x: int) -> int:
    """splitmix64 finaliser: a well-spread 64-bit value from any integer."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def draw_ahead(model: MockModel, reqs: Sequence[Request], k: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """`MockModel.draw_ahead` (its contract is there): `model`'s next `k` free tokens of each
    of `reqs` and the lag hash behind each.

    Speed: the call is dominated by NumPy's per-operation overhead at the batch sizes of
    a run (8-30), so each request's numbers go into one array in one conversion and
    every step works in place on whole (n × k) arrays; integer arithmetic mod 2^64 is
    exact in any order, so the tokens are the same as the scalar draws'."""
    n = len(reqs)
    if not 1 <= k <= LAG + 1:
        raise ValueError(f"draw_ahead draws 1..{LAG + 1} tokens, not {k}")
    km = k - 1
    flat: list[int] = []
    put = flat.extend
    lag_hash = model.lag_hash
    last_pos = km
    may_end = False
    for r in reqs:
        sp = r.sampling_params
        h = lag_hash(r)  # catches r._lag_len up to len(r.token_ids) - LAG
        ln, prompt = len(r.token_ids), r.num_prompt_tokens
        eos_from = _NEVER if sp.ignore_eos else prompt + sp.min_tokens
        may_end = may_end or eos_from <= ln + last_pos
        put((sp.seed & _M64, ln, eos_from, prompt, h))
        if km:
            a = r._lag_len
            put(r.token_ids[a:a + km])
    rows = _u64(flat).reshape(n, _HEAD + km)
    if km:  # H(tokens[:S + j]) = B^j (H(tokens[:S]) + sum_{i<j} (t_{S+i}+1) B^-(i+1))
        h = rows[:, _HEAD - 1:] * _B_INV[:k]
        h += _B_INV0[:k]  # column 0 keeps H(tokens[:S]); the others get (t + 1) B^-j
        np.add.accumulate(h, axis=1, out=h)  # np.cumsum without its Python wrapper
        h *= _B_POW[:k]
    else:
        h = rows[:, _HEAD - 1:]
    pos = rows[:, 1:2] + _STEPS_U[:k]  # the context length at each draw
    x = pos * _GOLD_U
    x += h
    x ^= np.uint64((model.seed * _SEED_MIX) & _M64)
    r = _mix_np(x)
    r ^= rows[:, 0:1]
    r = _mix_np(r)
    tokens = model._vocab_np[r % np.uint64(len(model.vocab_ids))]
    if may_end:
        eos_ok = pos >= rows[:, 2:3]
        if model.lengths.kind == "fixed":
            stop = eos_ok & ((pos - rows[:, 3:4]).astype(np.int64) + 1 >= model.lengths.mean)
        else:
            stop = _mix_np(r ^ _EOS_SALT) < np.uint64(model._p_eos)
            stop &= eos_ok
        tokens[stop] = model.eos_token_id
    return tokens, h


_HEAD = 5  # draw_ahead's numbers per request before its tokens: seed, length, EOS from,
#            prompt length, lag hash
_NEVER = 1 << 63  # "EOS from" of a request that ignores EOS
_B_INV0 = _B_INV.copy()
_B_INV0[0] = 0
_STEPS_U = _STEPS.astype(np.uint64)
_GOLD_U = np.uint64(_GOLD)
_EOS_SALT = np.uint64(0x5EED)

_C0, _C1, _C2 = (np.uint64(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9,
                                         0x94D049BB133111EB))
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _mix_np(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping multiplication, as `_mix`), in
    place: `x` is overwritten and returned."""
    x += _C0
    x ^= x >> _S30
    x *= _C1
    x ^= x >> _S27
    x *= _C2
    x ^= x >> _S31
    return x
