"""Speculative decoding as vLLM configures it: ``speculative_config`` JSON, plus one key of ours.

vLLM (``vllm/config/speculative.py``, commit 002e77c) takes ``method``, ``num_speculative_tokens``
(> 0), and optionally ``model`` (the draft weights) and ``draft_tensor_parallel_size``. doppelchip
runs no model, so the chance that a draft token is accepted is a parameter: ``acceptance_rate``
(the per-position probability that the draft at position k is accepted given the ones before it
were). Tokens per verification step are then 1 + Σ_{k=1..K} rateᵏ (the bonus token plus the
accepted drafts). Methods modelled: ``eagle`` / ``eagle3`` (a one-layer draft head on the
target's hidden states; EAGLE-3 also fuses three feature layers) and ``mtp`` (the model's own
multi-token-prediction layer, DeepSeek-V3).

SGLang's EAGLE adds two shapes and its own acceptance knob (doppelchip keys, set by
`doppelchip sglang serve`: doppelchip/sglang_spec.py). ``eagle_topk`` > 1 drafts a tree: each
of the ``num_speculative_tokens`` draft passes after the first runs ``eagle_topk`` branches per
request, and verification checks the ``num_draft_tokens`` - 1 best of them at once (tree
attention); at most ``num_speculative_tokens`` drafts (one path) are accepted. A chain
(``eagle_topk`` 1) verifies its ``num_speculative_tokens`` drafts (``num_draft_tokens`` =
``num_speculative_tokens`` + 1). ``acceptance_length`` L in place of ``acceptance_rate`` is
SGLang's ``SGLANG_SIMULATE_ACC_LEN``: every verification step of a batch accepts one drawn
length (bonus included) for all of its requests, ⌊L⌋ or ⌊L⌋ + 1 with the mean L
(``acceptance_method`` "match-expected", SGLang's default) or a normal draw around L rounded
("multinomial"), clamped to [1, ``num_speculative_tokens`` + 1]
(``sglang/srt/speculative/spec_utils.py``: ``sample_simulated_acc_len``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from devices.errors import DeviceError

METHODS = ("eagle", "eagle3", "mtp")
ACCEPTANCE_METHODS = ("match-expected", "multinomial")  # SGLANG_SIMULATE_ACC_METHOD's
_KEYS = {"method", "num_speculative_tokens", "acceptance_rate", "model",
         "draft_tensor_parallel_size", "eagle_topk", "num_draft_tokens", "acceptance_length",
         "acceptance_method"}


class SpeculativeConfigError(DeviceError, ValueError):
    """A speculative_config that vLLM would refuse, or that doppelchip cannot emulate."""


@dataclass(frozen=True)
class SpeculativeConfig:
    """One deployment's speculative decoding (see the module docstring)."""

    method: str
    num_speculative_tokens: int
    acceptance_rate: float | None = None
    model: str | None = None
    draft_tensor_parallel_size: int | None = None
    eagle_topk: int = 1
    num_draft_tokens: int | None = None  # (None: a chain's, num_speculative_tokens + 1)
    acceptance_length: float | None = None
    acceptance_method: str = "match-expected"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise SpeculativeConfigError(
                f"speculative_config method {self.method!r} is not emulated "
                f"(use one of {', '.join(METHODS)})")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or k < 1:
            raise SpeculativeConfigError("num_speculative_tokens must be an integer >= 1")
        if (self.acceptance_rate is None) == (self.acceptance_length is None):
            raise SpeculativeConfigError("speculative_config needs one of 'acceptance_rate' "
                                         "and 'acceptance_length'")
        if self.acceptance_rate is not None and not 0.0 <= self.acceptance_rate <= 1.0:
            raise SpeculativeConfigError("acceptance_rate must be in [0, 1]")
        if self.acceptance_length is not None and not self.acceptance_length > 0:
            raise SpeculativeConfigError("acceptance_length must be > 0 (tokens per "
                                         "verification step, bonus included)")
        if self.acceptance_method not in ACCEPTANCE_METHODS:
            raise SpeculativeConfigError(f"acceptance_method {self.acceptance_method!r}: one "
                                         f"of {', '.join(ACCEPTANCE_METHODS)}")
        if not isinstance(self.eagle_topk, int) or self.eagle_topk < 1:
            raise SpeculativeConfigError("eagle_topk must be an integer >= 1")
        tree = self.eagle_topk > 1
        if self.num_draft_tokens is None:
            if tree:
                raise SpeculativeConfigError("a tree (eagle_topk > 1) needs num_draft_tokens")
            object.__setattr__(self, "num_draft_tokens", k + 1)
        n = self.num_draft_tokens
        most = self.eagle_topk + (k - 1) * self.eagle_topk**2 + 1  # the candidates the
        # draft passes score (SGLang's organize_draft_results picks n - 1 of them), + the root
        if tree and not (isinstance(n, int) and 2 <= n <= most):
            raise SpeculativeConfigError(f"num_draft_tokens must be from 2 to {most} for this "
                                         "tree (the root and the drafts verified)")
        if not tree and n != k + 1:
            raise SpeculativeConfigError(f"num_draft_tokens must be num_speculative_tokens + 1 "
                                         f"= {k + 1} for a chain (eagle_topk 1)")

    @property
    def drafts_per_step(self) -> int:
        """The drafts each verification step checks (KV slots and token budget per decode):
        a chain's ``num_speculative_tokens``, a tree's ``num_draft_tokens`` - 1."""
        return self.num_draft_tokens - 1  # type: ignore[operator]

    @property
    def simulated_length(self) -> float:
        """`acceptance_length` clamped to what the steps can accept, [1, K + 1] (SGLang's
        clamp); the mean of a "match-expected" draw."""
        assert self.acceptance_length is not None
        return max(1.0, min(self.num_speculative_tokens + 1.0, self.acceptance_length))

    @property
    def expected_tokens_per_step(self) -> float:
        """The bonus token plus the expected accepted drafts: 1 + Σ_{k=1..K} rateᵏ, or
        SGLang's simulated length's mean (its clamp and rounding included)."""
        k, length = self.num_speculative_tokens, self.acceptance_length
        if length is None:
            r = self.acceptance_rate
            return 1.0 + sum(r**i for i in range(1, k + 1))  # type: ignore[operator]
        if self.acceptance_method == "match-expected":
            return self.simulated_length
        cdf = [0.5 * (1.0 + math.erf((j + 0.5 - length) / math.sqrt(2.0))) for j in range(k + 1)]
        # round(clamp(N(L, 1), 1, K + 1)) = j with Φ(j + ½ - L) - Φ(j - ½ - L), the ends taking
        # the tails
        return 1.0 + sum(1.0 - cdf[j] for j in range(1, k + 1))

    @staticmethod
    def parse(value: str | dict[str, Any] | SpeculativeConfig | None) -> SpeculativeConfig | None:
        """From vLLM's JSON string (or a dict, as in a fleet file); None stays None."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise SpeculativeConfigError(f"speculative_config is not JSON: {e}") from None
        if not isinstance(value, dict):
            raise SpeculativeConfigError("speculative_config must be a JSON object")
        unknown = sorted(set(value) - _KEYS)
        if unknown:
            raise SpeculativeConfigError(f"unknown speculative_config keys: {', '.join(unknown)}")
        for key in ("method", "num_speculative_tokens"):
            if key not in value:
                raise SpeculativeConfigError(f"speculative_config needs {key!r}")
        rate, length = value.get("acceptance_rate"), value.get("acceptance_length")
        return SpeculativeConfig(
            method=value["method"], num_speculative_tokens=value["num_speculative_tokens"],
            acceptance_rate=None if rate is None else float(rate), model=value.get("model"),
            draft_tensor_parallel_size=value.get("draft_tensor_parallel_size"),
            eagle_topk=value.get("eagle_topk", 1), num_draft_tokens=value.get("num_draft_tokens"),
            acceptance_length=None if length is None else float(length),
            acceptance_method=value.get("acceptance_method", "match-expected"))
