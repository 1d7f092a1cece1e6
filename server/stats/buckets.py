"""vLLM's histogram bucket families and `--custom-histogram-buckets`.

Every vLLM histogram draws its bounds from one family (`vllm/v1/metrics/buckets.py` at v0.33.0:
`BucketFamilyKey`, `_STATIC_FAMILY_DEFAULTS`, `histogram_buckets`); the flag replaces a family's
bounds for every histogram in it, and vLLM's `ObservabilityConfig` checks the JSON with the
messages `parse_custom_histogram_buckets` gives (`vllm/config/observability.py`,
`_validate_custom_histogram_buckets`). doppelchip's own histograms (`doppelchip_*`) keep their
bounds, as vLLM's subsystem histograms keep theirs.

Why a module of its own: both writers (engine and front end) and every reader build their
layouts from the same resolved bounds, and the flag is checked once, where the server starts.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping

REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
KV_CACHE_RESIDENCY_BUCKETS = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600,
    1200, 1800,
)

# family -> its default bounds; "request_tokens" is build_1_2_5_buckets(max_model_len)
FAMILY_DEFAULTS: dict[str, tuple[float, ...] | None] = {
    "request_latency": REQUEST_LATENCY_BUCKETS,
    "time_to_first_token": TIME_TO_FIRST_TOKEN_BUCKETS,
    "inter_token_latency": INTER_TOKEN_LATENCY_BUCKETS,
    "iteration_tokens": ITERATION_TOKENS_BUCKETS,
    "request_params_n": REQUEST_PARAMS_N_BUCKETS,
    "request_num_preemptions": REQUEST_NUM_PREEMPTIONS_BUCKETS,
    "request_tokens": None,
    "kv_cache_residency": KV_CACHE_RESIDENCY_BUCKETS,
}

Overrides = Mapping[str, tuple[float, ...]]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's 1-2-5 series up to `max_value`: build_1_2_5_buckets(100) = [1, 2, 5, ..., 100]."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


def family_buckets(family: str, max_model_len: int, overrides: Overrides | None = None
                   ) -> tuple[float, ...]:
    """The bounds of `family`: the override when given, else vLLM's default."""
    if overrides and family in overrides:
        return tuple(overrides[family])
    default = FAMILY_DEFAULTS[family]
    if default is None:
        return tuple(float(b) for b in build_1_2_5_buckets(max_model_len))
    return tuple(float(b) for b in default)


def parse_custom_histogram_buckets(text: str | None) -> dict[str, tuple[float, ...]]:
    """vLLM's `--custom-histogram-buckets` JSON (a family -> bounds mapping; "" or None: none),
    checked as vLLM checks it. Raises ValueError with vLLM's message."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"custom_histogram_buckets: not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError("custom_histogram_buckets: must be a JSON object mapping a bucket "
                         "family to a list of bounds")
    out: dict[str, tuple[float, ...]] = {}
    for family, buckets in value.items():
        if family not in FAMILY_DEFAULTS:
            raise ValueError(f"custom_histogram_buckets: unknown bucket family {family!r}; "
                             f"known families: {sorted(FAMILY_DEFAULTS)}")
        if not isinstance(buckets, list):
            raise ValueError(f"custom_histogram_buckets[{family!r}]: must be a list of bounds")
        if not buckets:
            raise ValueError(f"custom_histogram_buckets[{family!r}]: bucket list must not be "
                             "empty")
        for bound in buckets:
            if isinstance(bound, bool) or not isinstance(bound, (int, float)):
                raise ValueError(f"custom_histogram_buckets[{family!r}]: bound {bound!r} must "
                                 "be a number, not a boolean" if isinstance(bound, bool) else
                                 f"custom_histogram_buckets[{family!r}]: bound {bound!r} must "
                                 "be a number")
            if not math.isfinite(bound) or bound <= 0:
                raise ValueError(f"custom_histogram_buckets[{family!r}]: bound {bound!r} must "
                                 "be finite and greater than 0")
        if any(a >= b for a, b in itertools.pairwise(buckets)):
            raise ValueError(f"custom_histogram_buckets[{family!r}]: bounds {buckets} must be "
                             "strictly increasing")
        out[family] = tuple(float(b) for b in buckets)
    return out
