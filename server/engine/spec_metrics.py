"""vLLM's `--per-request-spec-decode-metrics`: one request's speculative-decoding acceptance,
as the response's `metrics.speculative_decoding` (vLLM 0.34.0's `RequestSpecDecodeMetrics` in
`vllm/v1/metrics/stats.py`, followed, not copied).

Why it exists: the aggregate `vllm:spec_decode_*` counters say how drafts fare on the whole
pod; a client tuning a draft model or a prompt style wants its own request's acceptance. The
engine core observes each verification step of the request (`speculate.verify`), the
finish message carries the tally to the front end (`Finished.spec_decode_metrics`), and the
HTTP answer writes `to_dict()` (a vLLM pod's) or `sglang_meta()` (an SGLang pod's `/generate`
meta_info, SGLang's view of the same counts).

Levels: `none` (off), `summary` (the histogram of accepted drafts per step and the drafted
total), `detailed` (also each step's accepted and drafted counts, in order). Only a request
the engine ends (EOS, stop token, length) carries it, as in vLLM: one a stop string ends is
finished by the front end, and its answer has no block.
"""

from __future__ import annotations

from typing import Any

import msgspec

LEVELS = ("none", "summary", "detailed")


class RequestSpecDecodeMetrics(msgspec.Struct, array_like=True):
    """One request's verification steps: `histogram[j]` counts the steps that accepted
    exactly j drafts (the bonus token not counted), `num_draft_tokens` the drafts proposed;
    `per_step_*` each step's counts, in order (`detailed` only)."""

    num_spec_tokens: int
    histogram: list[int]
    num_draft_tokens: int = 0
    per_step_accepted: list[int] = msgspec.field(default_factory=list)
    per_step_drafted: list[int] = msgspec.field(default_factory=list)

    @classmethod
    def new(cls, num_spec_tokens: int) -> RequestSpecDecodeMetrics:
        return cls(num_spec_tokens, [0] * (num_spec_tokens + 1))

    def observe(self, num_draft_tokens: int, num_accepted: int, detailed: bool) -> None:
        """One verification step: `num_accepted` of `num_draft_tokens` drafts accepted."""
        self.histogram[num_accepted] += 1
        self.num_draft_tokens += num_draft_tokens
        if detailed:
            self.per_step_accepted.append(num_accepted)
            self.per_step_drafted.append(num_draft_tokens)

    @property
    def num_spec_steps(self) -> int:
        """The verification steps observed."""
        return sum(self.histogram)

    @property
    def num_accepted_draft_tokens(self) -> int:
        """The drafts accepted over all steps (the bonus tokens not counted)."""
        return sum(j * count for j, count in enumerate(self.histogram))

    def to_dict(self) -> dict[str, Any]:
        """vLLM's `SpeculativeDecodingMetrics` fields: the mean acceptance length counts the
        bonus token (1 + accepted per step), the acceptance rate does not; the per-step lists
        only when they were recorded."""
        steps, accepted = self.num_spec_steps, self.num_accepted_draft_tokens
        out: dict[str, Any] = {
            "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": (accepted / self.num_draft_tokens
                                      if self.num_draft_tokens else 0.0),
            "acceptance_histogram": list(self.histogram),
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": self.num_draft_tokens,
            "num_spec_tokens": self.num_spec_tokens,
            "per_step_accepted": None,
            "per_step_drafted": None,
        }
        if self.per_step_accepted:
            out["per_step_accepted"] = list(self.per_step_accepted)
            out["per_step_drafted"] = list(self.per_step_drafted)
        return out

    def sglang_meta(self, completion_tokens: int) -> dict[str, Any]:
        """SGLang 0.5.23's meta_info fields for the same tally
        (`TokenizerManager._calculate_spec_decoding_metrics`): proposed drafts are the
        verification steps times the chain's drafts, the acceptance length the completion
        tokens (the prefill's first one included) per step, the histogram as long as its last
        non-zero count; nothing before a first verification step."""
        steps = self.num_spec_steps
        if not steps:
            return {}
        accepted, proposed = self.num_accepted_draft_tokens, steps * self.num_spec_tokens
        last = max(j for j, count in enumerate(self.histogram) if count)
        return {"spec_accept_rate": accepted / proposed,
                "spec_accept_length": completion_tokens / steps,
                "spec_num_correct_drafts": accepted, "spec_num_proposed_drafts": proposed,
                "spec_verify_ct": steps,
                "spec_correct_drafts_histogram": list(self.histogram[:last + 1])}
