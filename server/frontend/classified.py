"""The emulated output of a classifier — what a sequence-classification model's score head
would return — and of a cross-encoder scoring a query against a document.

No model runs, so, as `server.frontend.pooled` does for vectors, the answers are made from the
prompts' token ids, deterministic across pods and processes:
- a prompt's logits (`label_logits`): its pooled vector (`pooled.text_vector`, unit length)
  read by `num_labels` fixed random unit directions, scaled by √size so that each logit is
  about a standard normal over prompts; similar prompts get similar logits;
- a (query, document) pair's logit (`pair_logit`): the logit of the cosine of the two texts'
  vectors, clipped into [`EPS`, 1 − `EPS`], so that the probability the cross-encoder gives
  is the texts' bag-of-tokens cosine. ASSUMPTION: a real reranker follows meaning, not shared
  tokens; the emulation keeps the shape (a probability per pair, overlap ranked first), as the
  bi-encoder's cosine does.

The activation is vLLM's classifier pooler's (`resolve_classifier_act_fn`): a sigmoid for one
label, a softmax over several; `use_activation` false returns the raw logits (calibrated by
`--pooler-config`'s `logit_mean` / `logit_sigma` either way).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from server.frontend.pooled import cosine, text_vector

EPS = 1e-6  # the probability a pair's cosine is clipped to, at either end (a finite logit)


@functools.cache
def _directions(num_labels: int, size: int) -> np.ndarray:
    """`num_labels` fixed unit directions of `size` entries (the emulated score head)."""
    rows = np.random.default_rng(0x5C0E).standard_normal((num_labels, size))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def label_logits(ids: Sequence[int], num_labels: int, size: int,
                 special: frozenset[int] = frozenset()) -> np.ndarray:
    """One prompt's `num_labels` logits (float64)."""
    v = text_vector(ids, size, special).astype(np.float64)
    return np.sqrt(size) * (_directions(num_labels, size) @ v)


def pair_logit(query: np.ndarray, document: np.ndarray) -> float:
    """A cross-encoder's logit for a document against a query (one label), from their
    `pooled.text_vector`s."""
    p = min(max(cosine(query, document), EPS), 1 - EPS)
    return float(np.log(p / (1 - p)))


def activated(logits: np.ndarray, use_activation: bool, mean: float | None = None,
              sigma: float | None = None) -> list[float]:
    """The classifier's answer: probabilities (sigmoid of one logit, softmax of several), or
    the logits themselves; calibrated first by `--pooler-config`'s `logit_mean` and
    `logit_sigma` when given, (logit − mean) / sigma, as vLLM's classifier head."""
    if mean is not None:
        logits = logits - mean
    if sigma is not None:
        logits = logits / sigma
    if not use_activation:
        return [float(x) for x in logits]
    if len(logits) == 1:
        return [float(1 / (1 + np.exp(-logits[0])))]
    e = np.exp(logits - logits.max())
    return [float(x) for x in e / e.sum()]
