"""Speculative decoding's verification in the engine core (vLLM's speculative_config +
doppelchip's `acceptance_rate`, or SGLang's simulated `acceptance_length`).

With `acceptance_rate`, draft k is accepted with that probability given the ones before it,
drawn from a hash of (model seed, request seed, request context, position). With
`acceptance_length` (SGLang's SGLANG_SIMULATE_ACC_LEN), one length is drawn per verification
step from a hash of (model seed, verification steps so far) and every request of the step
accepts it, as SGLang's simulation does for its batch (`step_length`). Either way it is
deterministic under the seed, and a decode accepts at most `num_speculative_tokens` drafts
(a tree's depth) and at most the drafts it verified. The accepted tokens ARE the model's own
next tokens (exact-match verification), so outputs are identical to a run without
speculation; only the timing changes. The core's `stats` count drafts as vLLM's spec-decode
metrics do (SpecDecodingStats, vllm/v1/spec_decode/metrics.py @ 016a858), and a request's own
tally (`spec_metrics.py`) counts the same steps.
"""

from __future__ import annotations

import hashlib
from statistics import NormalDist
from typing import TYPE_CHECKING

from server.engine.request import Request
from server.engine.scheduler_config import SchedulerOutput

if TYPE_CHECKING:
    from server.engine.core import EngineCore


def _uniform(key: str) -> float:
    """A deterministic draw in [0, 1) from `key`."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2**64


def accepted_drafts(core: EngineCore, req: Request, k: int) -> int:
    """How many of `k` drafts verification accepts (`acceptance_rate`): a deterministic draw
    per position."""
    assert core.speculative is not None
    rate, h = core.speculative.acceptance_rate, core.model.context_hash(req)
    k = min(k, core.speculative.num_speculative_tokens)
    n = 0
    while n < k:
        if _uniform(f"{core.model.seed}:{req.sampling_params.seed}:{h}:{n}") >= rate:
            break
        n += 1
    return n


def step_length(core: EngineCore) -> int:
    """The tokens (accepted drafts + the bonus) every decode of this verification step accepts
    under SGLang's simulated length L (`sample_simulated_acc_len`): "match-expected" ⌊L⌋ + 1
    with probability L - ⌊L⌋, else ⌊L⌋; "multinomial" round(N(L, 1)); clamped to
    [1, num_speculative_tokens + 1]."""
    spec = core.speculative
    assert spec is not None and spec.acceptance_length is not None
    top, u = spec.num_speculative_tokens + 1, _uniform(
        f"{core.model.seed}:verify:{core.stats.spec_num_drafts}")
    if spec.acceptance_method == "multinomial":
        draw = spec.acceptance_length + NormalDist().inv_cdf(min(max(u, 1e-12), 1 - 1e-12))
        return round(max(1.0, min(top, draw)))
    length = spec.simulated_length
    lower = int(length)
    return lower + 1 if lower < top and u < length - lower else lower


def verify(core: EngineCore, output: SchedulerOutput, new_tokens: dict[str, list[int]],
           by_id: dict[str, Request]) -> set[str]:
    """Append each verified decode's accepted drafts (the model's own next tokens) to its new
    tokens and count the step; the ids of the requests verified."""
    spec: set[str] = set()
    st, detailed = core.stats, core.spec_metrics_level == "detailed"
    assert core.speculative is not None
    shared = step_length(core) - 1 if core.speculative.acceptance_length is not None else None
    for s in output.scheduled:
        if not s.num_draft_tokens or s.request_id not in new_tokens:
            continue
        req, tokens = by_id[s.request_id], new_tokens[s.request_id]
        accepted = (min(shared, s.num_draft_tokens) if shared is not None
                    else accepted_drafts(core, req, s.num_draft_tokens))
        for _ in range(accepted):
            with req.lookahead(tokens) as ahead:
                tokens.append(core.model.next_token(ahead))
        st.spec_num_drafts += 1
        st.spec_num_draft_tokens += s.num_draft_tokens
        st.spec_num_accepted_tokens += accepted
        for i in range(accepted):
            st.spec_num_accepted_tokens_per_pos[i] += 1
        if req.spec_decode_metrics is not None:
            req.spec_decode_metrics.observe(s.num_draft_tokens, accepted, detailed)
        spec.add(s.request_id)
    return spec
