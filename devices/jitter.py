"""Step-time noise: deterministic by default, optional seeded multiplicative noise.

Real steps vary a little (clocks, contention, the host). The default adds none; with
``sigma > 0`` each step's time is multiplied by a log-normal factor of mean 1 drawn from a
seeded generator, so runs stay reproducible. Engines whose schedule is fixed at compile time
(Groq: ``deterministic`` in the catalogue) never get noise.
"""

from __future__ import annotations

import math

import numpy as np

from devices.placed import Placement


class Jitter:
    def __init__(self, sigma: float = 0.0, seed: int = 0) -> None:
        if sigma < 0:
            raise ValueError("sigma must be >= 0")
        self.sigma = sigma
        self._rng = np.random.default_rng(seed) if sigma > 0 else None
        self._mu = -sigma * sigma / 2  # mean of exp(N(mu, sigma)) is 1

    def apply(self, seconds: float) -> float:
        """``seconds`` with noise applied (unchanged when sigma is 0)."""
        if self._rng is None:
            return seconds
        return seconds * math.exp(self._rng.normal(self._mu, self.sigma))


def make_jitter(placement: Placement, sigma: float = 0.0, seed: int = 0) -> Jitter:
    """The jitter model for a deployment: zero for deterministic engines whatever ``sigma``."""
    return Jitter(0.0 if placement.engine.deterministic else sigma, seed)
