"""Speculative decoding's verification in the engine core (vLLM's speculative_config +
doppelchip's `acceptance_rate`).

Draft k is accepted with probability `acceptance_rate` given the ones before it, drawn from a
hash of (model seed, request seed, request context, position): deterministic under the seed.
The accepted tokens ARE the model's own next tokens (exact-match verification), so outputs are
identical to a run without speculation; only the timing changes. The core's `stats` count
drafts as vLLM's spec-decode metrics do (SpecDecodingStats, vllm/v1/spec_decode/metrics.py
@ 016a858), and a request's own tally (`spec_metrics.py`) counts the same steps.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from server.engine.request import Request
from server.engine.scheduler_config import SchedulerOutput

if TYPE_CHECKING:
    from server.engine.core import EngineCore


def accepted_drafts(core: EngineCore, req: Request, k: int) -> int:
    """How many of `k` drafts verification accepts: a deterministic draw per position."""
    assert core.speculative is not None
    rate, h = core.speculative.acceptance_rate, core.model.context_hash(req)
    n = 0
    while n < k:
        key = f"{core.model.seed}:{req.sampling_params.seed}:{h}:{n}".encode()
        u = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64
        if u >= rate:
            break
        n += 1
    return n


def verify(core: EngineCore, output: SchedulerOutput, new_tokens: dict[str, list[int]],
           by_id: dict[str, Request]) -> set[str]:
    """Append each verified decode's accepted drafts (the model's own next tokens) to its new
    tokens and count the step; the ids of the requests verified."""
    spec: set[str] = set()
    st, detailed = core.stats, core.spec_metrics_level == "detailed"
    for s in output.scheduled:
        if not s.num_draft_tokens or s.request_id not in new_tokens:
            continue
        req, tokens = by_id[s.request_id], new_tokens[s.request_id]
        accepted = accepted_drafts(core, req, s.num_draft_tokens)
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
