"""Emulated log-probabilities: the mock model has no logits, so doppelchip reports a synthetic
distribution, deterministic and self-consistent, instead of refusing `logprobs`.

The rule (docs/HTTP.md), for the token `t` generated at output position `j` of a sequence
whose seed is `s` (the request's seed, 0 when unset, + the choice index for n > 1):
- `r = mix(s, j, t)` (splitmix64 of the three), `u = r / 2^64` in [0, 1);
- the generated token has probability `p0 = 0.5 + 0.5·u`, so its logprob is `ln p0` in
  (−0.69, 0]: it is always the most likely token;
- the k-th alternative (k = 1, 2, …) is a token drawn by `mix(r, k)` from the tokens the mock
  model generates (never `t`, no repeats) with probability `(1 − p0)·2^−k`, so the listed
  probabilities are in decreasing order and sum to less than 1.
The same request therefore gets the same logprobs streamed or not, on every run; forced tokens
of a grammar get the same synthetic values (their real probability is 1). A prompt's tokens
(`prompt_logprobs`, completions `echo`) follow the same rule with seed 0 at positions of their
own (`PROMPT + i`), so a prompt scores the same whatever the request's seed and choices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from server.engine.tokenizer import Tokenizer

_M64 = (1 << 64) - 1
_LN2 = math.log(2.0)


def _mix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class Logprobs:
    """The synthetic distribution at each position of one sequence."""

    def __init__(self, tokenizer: Tokenizer, seed: int, as_ids: bool = False) -> None:
        self.tok = tokenizer
        self.seed = seed & _M64
        self.pool = tokenizer.free_text_token_ids
        self.as_ids = as_ids  # vLLM's return_tokens_as_token_ids: "token_id:N", not text

    def top(self, position: int, token: int, k: int) -> list[tuple[int, float]]:
        """The `k` most likely tokens at `position` (the generated one first) with their
        logprobs; at least the generated token."""
        r = _mix(_mix(_mix(self.seed) ^ position) ^ token)
        p0 = 0.5 + 0.5 * (r / 2**64)
        out = [(token, math.log(p0))]
        # the alternatives' log-probabilities in log space (ln(1 - p0) - k ln 2): no underflow
        # to log(0) however many are asked (p0 rounds to 1.0 once in 2^54: hence the floor)
        rest = math.log(max(1.0 - p0, 2.0**-54))
        k = min(k, len(self.pool))  # no more alternatives than the pool holds, or no end
        seen = {token}
        i = 1
        while len(out) < k:
            alt = self.pool[_mix(r + i) % len(self.pool)]
            i += 1
            if alt in seen:
                continue
            seen.add(alt)
            out.append((alt, rest - len(out) * _LN2))
        return out

    def text(self, token: int, special: bool = False) -> str:
        """A token as the logprobs name it (`special`: its special text written out)."""
        if self.as_ids:
            return f"token_id:{token}"
        return self.tok.decode_with_special([token]) if special else self.tok.decode([token])


def too_many(asked: int, allowed: int, what: str = "sample") -> str | None:
    """vLLM's refusal (`SamplingParams._validate_logprobs`) when `asked` logprobs exceed
    `allowed` (the deployment's --max-logprobs, -1 already resolved by the caller); `what`:
    "sample" or "prompt". None when within it. One wording for every protocol."""
    if asked <= allowed:
        return None
    return (f"Requested {what} logprobs of {asked}, which is greater than max allowed: "
            f"{allowed}")


PROMPT = -(1 << 32)  # prompt position i is PROMPT + i: a stream of its own (outputs are >= 0)


def prompt_logprobs(lp: Logprobs, prompt: Sequence[int], k: int) -> list[dict | None]:
    """vLLM's `prompt_logprobs` of a prompt: None for its first token (nothing precedes it),
    then for each token `{id: {"logprob", "rank", "decoded_token"}}` — the token (by the rule,
    the most likely, rank 1) and the next alternatives, `max(1, k)` in all."""
    out: list[dict | None] = [None]
    for i, t in enumerate(prompt[1:], 1):
        top = lp.top(PROMPT + i, t, max(1, k))
        out.append({str(a): {"logprob": v, "rank": r, "decoded_token": lp.text(a)}
                    for r, (a, v) in enumerate(top, 1)})
    return out


def echo_logprobs(lp: Logprobs, prompt: Sequence[int], k: int) -> dict:
    """The completions `logprobs` of an echoed prompt, as vLLM writes the prompt's positions
    before the output's: the first token with a None logprob and no top (written out with its
    special text, `tokenizer.decode`), offsets from 0 over each token's text."""
    out: dict[str, list] = {"text_offset": [], "token_logprobs": [], "tokens": [],
                            "top_logprobs": []}
    offset = 0
    for i, t in enumerate(prompt):
        text = lp.text(t, special=i == 0)
        top = lp.top(PROMPT + i, t, max(1, k)) if i else None
        out["tokens"].append(text)
        out["token_logprobs"].append(top[0][1] if top else None)
        out["top_logprobs"].append({lp.text(a): v for a, v in top} if top else None)
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def completion_logprobs(lp: Logprobs, ids: Sequence[int], start: int, k: int,
                        text_offset: int) -> dict:
    """vLLM's completions `logprobs` object for output tokens `ids` at positions `start`…:
    `tokens`, `token_logprobs`, `top_logprobs` (k entries, the generated token's included),
    `text_offset`."""
    tokens, values, tops, offsets = [], [], [], []
    offset = text_offset
    for j, t in enumerate(ids):
        top = lp.top(start + j, t, max(1, k))
        text = lp.text(t)
        tokens.append(text)
        values.append(top[0][1])
        tops.append({lp.text(a): v for a, v in top[: max(1, k)]})
        offsets.append(offset)
        offset += len(text)
    return {"text_offset": offsets, "token_logprobs": values, "tokens": tokens,
            "top_logprobs": tops}


def chat_logprobs(lp: Logprobs, ids: Sequence[int], start: int, k: int) -> list[dict]:
    """vLLM's chat `logprobs.content` entries: token, logprob, bytes, top_logprobs (k)."""
    content = []
    for j, t in enumerate(ids):
        top = lp.top(start + j, t, max(1, k))
        text = lp.text(t)
        content.append({  # (the bytes are the token's text even as "token_id:N", vLLM's)
            "token": text, "logprob": top[0][1], "bytes": list(lp.tok.decode([t]).encode()),
            "top_logprobs": [{"token": (s := lp.text(a)), "logprob": v,
                              "bytes": list(s.encode())} for a, v in top[:k]],
        })
    return content
