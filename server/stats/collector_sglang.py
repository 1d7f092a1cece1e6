"""The exposition of an SGLang pod (`--http-api sglang --enable-metrics`): SGLang 0.5.23's
`sglang:` series instead of vLLM's, from the same stats arrays (`server.stats.schema_sglang`).

Labels as SGLang sets them: the tokenizer manager's series carry `model_name` (the served
name) and `engine_type` (`unified`: no P/D role); the scheduler's add `tp_rank`, `pp_rank`,
`moe_ep_rank` (0: one scheduler per data-parallel rank reports, its first TP/PP rank) and,
with several data-parallel ranks, `dp_rank`. The tokenizer's series sum the front ends' rows
of every rank (SGLang has one tokenizer manager over its DP ranks); the scheduler's are per
rank. doppelchip's own device series stay (`doppelchip_*`, no clash with any SGLang name).

Two scheduler gauges are windows in SGLang (its last prefill batch, its last decode log
interval); here both are over the window since the previous scrape this front end rendered
(`WindowRatio`, `Throughput`): `sglang:cache_hit_rate` the rank's prefix-cache hits over lookups
then, held while nothing was looked up (SGLang's gauge keeps its last prefill's value), and
`sglang:gen_throughput` its tokens per emulated second, 0 when idle (docs/SGLANG.md). The
speculative gauges are windows of the same kind (SGLang's decode log interval): the accepted
length, (accepted drafts + steps) / steps, and the acceptance rate, accepted over steps x drafts
per step; 0 on a pod that does not speculate, as SGLang's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from server.ipc.deployment import DeploymentInfo
from server.stats.exposition import Exposition, Scrape
from server.stats.layout import Layout
from server.stats.schema_sglang import SCHEDULER_FAMILIES, SCHEDULER_SERIES

Source = Callable[[Scrape], np.ndarray | None]


def tokenizer_labels(info: DeploymentInfo) -> list[tuple[str, str]]:
    return [("model_name", info.model_name), ("engine_type", "unified")]


def scheduler_labels(info: DeploymentInfo) -> list[tuple[str, str]]:
    labels = [*tokenizer_labels(info), ("tp_rank", "0"), ("pp_rank", "0"), ("moe_ep_rank", "0")]
    if info.data_parallel_size > 1:
        labels.append(("dp_rank", str(info.dp_rank)))
    return labels


class Throughput:
    """Tokens per emulated second of one rank between two renders (SGLang's gen_throughput is
    over its last decode log interval); 0 before the second render or with no time passed."""

    def __init__(self) -> None:
        self.last: tuple[float, float] | None = None

    def __call__(self, generated: float, t: float) -> float:
        prev, self.last = self.last, (generated, t)
        if prev is None or t <= prev[1]:
            return 0.0
        return (generated - prev[0]) / (t - prev[1])


class WindowRatio:
    """One counter's increase over another's between two reads of one rank (prefix-cache hits
    over lookups; accepted drafts over verification steps); the last value while the second
    did not move (SGLang's gauges hold their last batch's or log interval's value)."""

    def __init__(self) -> None:
        self.last, self.value = (0.0, 0.0), 0.0

    def __call__(self, hits: float, queries: float) -> float:
        (h0, q0), self.last = self.last, (hits, queries)
        if queries > q0:
            self.value = (hits - h0) / (queries - q0)
        return self.value


def compile_sglang(plan: Exposition, infos: list[list[DeploymentInfo]],
                   request_layout: Layout, engine_layouts: dict[tuple[int, int], Layout],
                   keys: list[tuple[int, int]]) -> None:
    """Add every sglang: series of the (one) deployment's ranks to `plan`."""
    offset = request_layout.offset
    for d_index, ranks in enumerate(infos):
        rows = [k for k, key in enumerate(keys) if key[0] == d_index]
        if not ranks:
            continue

        def summed(s: Scrape, rows: list[int] = rows) -> np.ndarray:
            return s.requests[rows].sum(axis=0)

        for d in request_layout.defs.values():
            if not d.name.startswith("sglang:"):
                continue
            if d.name in SCHEDULER_FAMILIES:  # per rank
                for k, key in enumerate(keys):
                    if key[0] == d_index:
                        info = infos[key[0]][key[1]]
                        plan.add_def(d, scheduler_labels(info),
                                     lambda s, k=k: s.requests[k], offset[d.name])
            else:
                plan.add_def(d, tokenizer_labels(ranks[0]), summed, offset[d.name])
        for info in ranks:
            if info.placed:
                _scheduler(plan, (d_index, info.rank), info, engine_layouts[(d_index,
                                                                                info.rank)])


def _scheduler(plan: Exposition, key: tuple[int, int], info: DeploymentInfo,
               layout: Layout) -> None:
    cap = info.capacity
    bs, total = cap.block_size, cap.kv_blocks_total
    slot = layout.slot
    running, waiting = slot("vllm:num_requests_running"), slot("vllm:num_requests_waiting")
    used, generated, t = slot("_kv_used"), slot("_generated"), slot("_t")
    queries, hits = slot("vllm:prefix_cache_queries"), slot("vllm:prefix_cache_hits")
    preemptions = slot("vllm:num_preemptions")
    rate, hit_rate = Throughput(), WindowRatio()
    k = info.num_speculative_tokens  # (its counters exist only when it speculates)
    width = info.drafts_per_step  # drafts per verification (SGLang's draft tokens - 1)
    drafts = slot("vllm:spec_decode_num_drafts") if k else 0
    accepted = slot("vllm:spec_decode_num_accepted_tokens") if k else 0
    length, acceptance = WindowRatio(), WindowRatio()

    def value(fn: Callable[[np.ndarray], float]) -> Source:
        def source(s: Scrape) -> np.ndarray | None:
            arr = s.engines[key]
            return None if arr is None else np.array([float(fn(arr))])
        return source

    values: dict[str, Source] = {
        "sglang:num_running_reqs": value(lambda a: a[running]),
        "sglang:num_queue_reqs": value(lambda a: a[waiting]),
        "sglang:gen_throughput": value(lambda a: rate(a[generated], a[t])),
        "sglang:cache_hit_rate": value(lambda a: hit_rate(a[hits], a[queries])),
        "sglang:token_usage": value(lambda a: a[used] / total if total else 0.0),
        "sglang:num_used_tokens": value(lambda a: a[used] * bs),
        "sglang:kv_used_tokens": value(lambda a: a[used] * bs),
        "sglang:num_retracted_requests": value(lambda a: a[preemptions]),
        "sglang:max_total_num_tokens": value(lambda a: total * bs),
        "sglang:page_size": value(lambda a: bs),
        "sglang:num_pages": value(lambda a: total),
        "sglang:context_len": value(lambda a: cap.max_model_len),
        "sglang:spec_accept_length": value(
            lambda a: length(a[accepted] + a[drafts], a[drafts]) if k else 0.0),
        "sglang:spec_accept_rate": value(
            lambda a: acceptance(a[accepted], a[drafts] * width) if k else 0.0),
    }
    labels = scheduler_labels(info)
    for name, (kind, doc) in SCHEDULER_SERIES.items():
        plan.add_value(name, kind, doc, labels, values[name])
