"""A speculating TensorRT-LLM pod's speculative-decoding stats: the `specDecodingStats` of its
`/metrics` iteration stats and the `trtllm_spec_decode_*` series of `/prometheus/metrics`.

As TensorRT-LLM defines them (`SpecDecodingStats` in `cpp/include/tensorrt_llm/executor/
types.h`; `MetricsCollector.log_iteration_stats` and `log_request_metrics_dict` in
`tensorrt_llm/metrics/collector.py`, the stored 2026 version):

- `numDraftTokens`, `numAcceptedTokens`: the drafts proposed and accepted in the iteration;
  `numRequestsWithDraftTokens`: the requests that verified drafts; `acceptanceLength`: the
  tokens each of those produced per step, (accepted + requests) / requests; `iterLatencyMS`:
  the draft passes' time; `draftOverhead`: that time over the iteration's;
- the counters `trtllm_spec_decode_num_draft_tokens_total` and `..._num_accepted_tokens_total`
  sum the iterations' counts, the gauges `..._acceptance_length` and `..._draft_overhead` show
  the latest iteration's; the per-request counters `trtllm_spec_decode_drafted_tokens_total`
  and `..._accepted_tokens_total` count by draft position (`token_position`).

Here, as for the other iteration values (collector_trtllm.py), an "iteration" is the window of
engine steps since the previous refresh (a refresh happens when a request has finished): its
counts are the window's, its latencies the window's mean per step. The draft time is the cost
model's (`StepCost.draft_s`, the draft passes' share of each step). The per-position counters
are the engine's since start-up (TensorRT-LLM adds a request's when it finishes): position i
drafted once per request and verification step (one path of a tree per depth).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from server.ipc.deployment import DeploymentInfo
from server.stats.exposition import Exposition, Scrape
from server.stats.layout import Layout
from server.stats.schema_trtllm import SPEC_SERIES

DECODING_TYPE = {"eagle": "Eagle", "eagle3": "Eagle3", "mtp": "MTP"}  # method -> decoding_type


class SpecWindow:
    """The speculative values of the latest refresh: totals, and the window since the one
    before (`refresh` is called by `Iteration.compute`, at the same moments)."""

    def __init__(self, info: DeploymentInfo, layout: Layout) -> None:
        slot = layout.slot
        self.k = info.num_speculative_tokens
        self.slots = (slot("vllm:spec_decode_num_drafts"),
                      slot("vllm:spec_decode_num_draft_tokens"),
                      slot("vllm:spec_decode_num_accepted_tokens"), slot("_draft_seconds"))
        self.positions = [slot("vllm:spec_decode_num_accepted_tokens_per_pos", str(i))
                          for i in range(self.k)]
        self.last = np.zeros(4)
        self.window = np.zeros(4)  # drafts, draft tokens, accepted, draft seconds
        self.steps = self.busy = 0.0  # the window's engine steps and their time

    def refresh(self, arr: np.ndarray, steps: float, busy: float) -> None:
        """The window from the previous refresh to `arr` (the engine's array): `steps`
        engine steps that took `busy` seconds."""
        now = arr[list(self.slots)]
        self.window, self.last = now - self.last, now
        self.steps, self.busy = steps, busy

    @property
    def acceptance_length(self) -> float:
        drafts, _, accepted, _ = self.window
        return (accepted + drafts) / drafts if drafts else 0.0

    @property
    def overhead(self) -> float:
        """The draft passes' share of the window's time."""
        return float(self.window[3] / self.busy) if self.busy > 0 else 0.0

    def stat(self) -> dict:
        """`specDecodingStats` of one `/metrics` entry."""
        drafts, draft_tokens, accepted, draft_s = self.window
        return {"acceptanceLength": self.acceptance_length,
                "draftOverhead": self.overhead,
                "iterLatencyMS": draft_s / self.steps * 1000.0 if self.steps else 0.0,
                "numAcceptedTokens": int(accepted), "numDraftTokens": int(draft_tokens),
                "numRequestsWithDraftTokens": int(drafts)}


def config_info(info: DeploymentInfo) -> list[tuple[str, str]]:
    """`_log_config_info_metrics`' speculative labels (only for a pod that speculates)."""
    out = [("spec_enabled", "true"),
           ("spec_method", DECODING_TYPE.get(info.speculative_method, info.speculative_method)),
           ("spec_num_tokens", str(info.num_speculative_tokens))]
    return out + ([("spec_draft_model", info.speculative_model)]
                  if info.speculative_model else [])


def add_series(plan: Exposition, key: tuple[int, int], spec: SpecWindow,
               read: Callable[[Scrape], object | None], base: list[tuple[str, str]],
               pid: list[tuple[str, str]]) -> None:
    """The trtllm_spec_decode_* series of one speculating deployment (rank 0's). `read(s)`
    refreshes the held values (None while the engine is not up)."""

    def held(fn: Callable[[], float], counter: bool = False
             ) -> Callable[[Scrape], np.ndarray | None]:
        def source(s: Scrape) -> np.ndarray | None:
            if read(s) is None:
                return None
            v = fn()
            return None if counter and not v else np.array([v])
        return source

    drafts = spec.slots[0]
    values = {
        "trtllm_spec_decode_num_draft_tokens": held(lambda: spec.last[1], counter=True),
        "trtllm_spec_decode_num_accepted_tokens": held(lambda: spec.last[2], counter=True),
        "trtllm_spec_decode_acceptance_length": held(lambda: spec.acceptance_length),
        "trtllm_spec_decode_draft_overhead": held(lambda: spec.overhead),
    }
    for name, (kind, doc, label) in SPEC_SERIES.items():
        if label is None:
            plan.add_value(name, kind, doc, base if kind == "counter" else base + pid,
                           values[name])
            continue
        for i, accepted in enumerate(spec.positions):
            index = drafts if name == "trtllm_spec_decode_drafted_tokens" else accepted
            plan.add_value(name, kind, doc, [*base, (label, str(i))], _live(key, index))


def _live(key: tuple[int, int], index: int) -> Callable[[Scrape], np.ndarray | None]:
    """The engine's counter at `index`, once it counted something."""
    def source(s: Scrape) -> np.ndarray | None:
        arr = s.engines[key]
        return None if arr is None or not arr[index] else arr[index:index + 1]
    return source
