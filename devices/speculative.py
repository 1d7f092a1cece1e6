"""Speculative decoding as vLLM configures it: ``speculative_config`` JSON, plus one key of ours.

vLLM (``vllm/config/speculative.py``, commit 002e77c) takes ``method``, ``num_speculative_tokens``
(> 0), and optionally ``model`` (the draft weights) and ``draft_tensor_parallel_size``. doppelchip
runs no model, so the chance that a draft token is accepted is a parameter: ``acceptance_rate``
(the per-position probability that the draft at position k is accepted given the ones before it
were). Tokens per verification step are then 1 + Σ_{k=1..K} rateᵏ (the bonus token plus the
accepted drafts). Methods modelled: ``eagle`` / ``eagle3`` (a one-layer draft head on the
target's hidden states; EAGLE-3 also fuses three feature layers) and ``mtp`` (the model's own
multi-token-prediction layer, DeepSeek-V3).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from devices.errors import DeviceError

METHODS = ("eagle", "eagle3", "mtp")
_KEYS = {"method", "num_speculative_tokens", "acceptance_rate", "model",
         "draft_tensor_parallel_size"}


class SpeculativeConfigError(DeviceError, ValueError):
    """A speculative_config that vLLM would refuse, or that doppelchip cannot emulate."""


@dataclass(frozen=True)
class SpeculativeConfig:
    """One deployment's speculative decoding (see the module docstring)."""

    method: str
    num_speculative_tokens: int
    acceptance_rate: float
    model: str | None = None
    draft_tensor_parallel_size: int | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise SpeculativeConfigError(
                f"speculative_config method {self.method!r} is not emulated "
                f"(use one of {', '.join(METHODS)})")
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens < 1:
            raise SpeculativeConfigError("num_speculative_tokens must be an integer >= 1")
        if not 0.0 <= self.acceptance_rate <= 1.0:
            raise SpeculativeConfigError("acceptance_rate must be in [0, 1]")

    @property
    def expected_tokens_per_step(self) -> float:
        """1 + Σ_{k=1..K} rateᵏ: the bonus token plus the expected accepted drafts."""
        r = self.acceptance_rate
        return 1.0 + sum(r**k for k in range(1, self.num_speculative_tokens + 1))

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
        for key in ("method", "num_speculative_tokens", "acceptance_rate"):
            if key not in value:
                raise SpeculativeConfigError(f"speculative_config needs {key!r}")
        return SpeculativeConfig(
            method=value["method"], num_speculative_tokens=value["num_speculative_tokens"],
            acceptance_rate=float(value["acceptance_rate"]), model=value.get("model"),
            draft_tensor_parallel_size=value.get("draft_tensor_parallel_size"))
