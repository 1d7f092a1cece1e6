"""The request lengths of a synthetic workload (`WorkloadSpec.length_dist`): fixed, uniform,
normal, or drawn from a histogram file of (input, output, weight) rows.

Why apart from `workloads.py`: how long each request is, is one decision, read and tested on
its own; the workloads decide what the prompts hold and when they arrive.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def length_draw(dist: str, isl: int, osl: int, spread: float, path: str,
                rng: np.random.Generator) -> Callable[[], tuple[int, int]]:
    """A draw() of (input, output) lengths: fixed at isl/osl (consuming no randomness), uniform
    within ±spread of them, normal with a standard deviation of spread × mean (at least 1),
    or the pairs of a histogram file (`histogram`)."""
    if dist == "fixed":
        return lambda: (isl, osl)
    if spread < 0:
        raise ValueError("length_spread must be >= 0")
    if dist == "uniform":
        lo = [max(1, round(m * (1 - spread))) for m in (isl, osl)]
        hi = [max(1, round(m * (1 + spread))) for m in (isl, osl)]
        return lambda: tuple(int(rng.integers(a, b + 1)) for a, b in zip(lo, hi, strict=True))
    if dist == "histogram":
        pairs, weights = histogram(path)
        return lambda: pairs[int(rng.choice(len(pairs), p=weights))]
    if dist == "normal":
        return lambda: tuple(max(1, round(rng.normal(m, spread * m)))
                             for m in (isl, osl))
    raise ValueError(f"unknown length distribution {dist!r}; fixed, uniform, normal, histogram")


def histogram(path: str) -> tuple[list[tuple[int, int]], np.ndarray]:
    """(input, output) length pairs and their probabilities from a CSV file of
    `input,output,weight` rows (a header row and # comments are allowed)."""
    if not path:
        raise ValueError("the histogram length distribution needs a length file")
    pairs, weights = [], []
    with open(path) as f:
        for n, line in enumerate(f, start=1):
            line = line.split("#", 1)[0].strip()
            if not line or line.lower().startswith("input"):
                continue
            try:
                i, o, w = (float(x) for x in line.split(","))
            except ValueError:
                raise ValueError(f"{path}:{n}: expected input,output,weight") from None
            if i < 1 or o < 1 or w < 0:
                raise ValueError(f"{path}:{n}: lengths must be >= 1 and weights >= 0")
            pairs.append((int(i), int(o)))
            weights.append(w)
    total = sum(weights)
    if not pairs or total <= 0:
        raise ValueError(f"{path}: no length with a positive weight")
    return pairs, np.asarray(weights) / total
