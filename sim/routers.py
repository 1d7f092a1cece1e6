"""Routing policies of a virtual-time cluster: which replica gets an arriving request.

Each policy is a small class with one method, `choose(prompt, outstanding) -> index`, called
by the cluster's event loop (`sim.virtual.run_cluster`) at the request's arrival
time. `outstanding[i]` is the number of requests routed to replica i and not yet finished —
what a router counts itself. Policies that look inside a replica (KV usage, prefix cache)
read the replica's real `EngineCore` scheduler: the blocks it holds, the radix tree it
matches against. Ties go to the replica with fewer outstanding requests, then to the lower
index, so every policy is deterministic for a given seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from server.engine.core import EngineCore
from server.engine.intake import dp_score


class RoundRobin:
    """Replicas in turn, whatever their load."""

    def __init__(self, cores: Sequence[EngineCore], seed: int = 0) -> None:
        self.n, self.next = len(cores), 0

    def choose(self, prompt: Sequence[int], outstanding: Sequence[int]) -> int:
        k, self.next = self.next, (self.next + 1) % self.n
        return k


class LeastRequests:
    """Fewest outstanding requests, ties to the lower index: Vidur's `lor` global scheduler
    (a `min` over the replicas); production-stack's router breaks its lowest-QPS ties the same
    way (the first endpoint). Envoy's LEAST_REQUEST compares two random hosts: `PowerOfTwo`."""

    def __init__(self, cores: Sequence[EngineCore], seed: int = 0) -> None:
        pass

    def choose(self, prompt: Sequence[int], outstanding: Sequence[int]) -> int:
        return min(range(len(outstanding)), key=lambda k: (outstanding[k], k))


def kv_usage(core: EngineCore) -> float:
    """The fraction of the KV pool held by requests (cached-but-evictable blocks are free)."""
    s = core.scheduler
    return (s.pool.num_used - s.cache.evictable_blocks) / s.config.num_blocks


class LeastKv:
    """Lowest KV-cache usage (llm-d's kv-cache-utilization scorer), ties to fewer requests."""

    def __init__(self, cores: Sequence[EngineCore], seed: int = 0) -> None:
        self.cores = list(cores)

    def choose(self, prompt: Sequence[int], outstanding: Sequence[int]) -> int:
        return min(range(len(self.cores)),
                   key=lambda k: (kv_usage(self.cores[k]), outstanding[k], k))


HOST_WEIGHT = 0.8  # llm-d-kv-cache pkg/kvcache/backend.go: the "cpu" medium's default weight


def tiered_match(core: EngineCore, prompt: Sequence[int]) -> float:
    """The tokens of `prompt` a replica holds from its start, device blocks counting 1 and
    blocks only its CPU tier holds `HOST_WEIGHT` (neither tree touched)."""
    device = core.scheduler.cache.peek_prefix_len(prompt)
    tier = core.scheduler.offload
    if tier is None:
        return device
    return device + HOST_WEIGHT * max(0, tier.cache.peek_prefix_len(prompt) - device)


class PrefixAware:
    """Cache-aware routing as SGLang's router does it (sgl-router `policies/cache_aware.rs`,
    its defaults: cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5),
    but matched against each replica's real radix cache (without touching it), as llm-d's
    precise prefix scorer does from KV events, instead of SGLang's approximate tree:

    - load imbalanced (max - min outstanding > abs AND max > rel × min): fewest outstanding;
    - else the longest match, if it covers more than `cache_threshold` of the prompt;
    - else the replica caching the fewest blocks (SGLang's "smallest tree": most room).

    Ties go to fewer outstanding requests, then the lower index. A replica with the prefix
    cache off matches nothing and caches nothing. A replica with a CPU offloading tier
    (docs/KV_OFFLOAD.md) matches what either tier holds, its host-only blocks weighing
    `HOST_WEIGHT` of a device block, as llm-d's scorer weighs the CPU medium of the KV
    events (llm-d-kv-cache `DefaultKVCacheBackendConfig`: gpu 1.0, cpu 0.8; each block
    counts its best tier)."""

    def __init__(self, cores: Sequence[EngineCore], seed: int = 0, cache_threshold: float = 0.3,
                 balance_abs_threshold: int = 64, balance_rel_threshold: float = 1.5) -> None:
        self.cores = list(cores)
        self.cache_threshold = cache_threshold
        self.abs_threshold, self.rel_threshold = balance_abs_threshold, balance_rel_threshold

    def choose(self, prompt: Sequence[int], outstanding: Sequence[int]) -> int:
        ks = range(len(self.cores))
        hi, lo = max(outstanding), min(outstanding)
        if hi - lo > self.abs_threshold and hi > lo * self.rel_threshold:
            return min(ks, key=lambda k: (outstanding[k], k))
        matched = [tiered_match(c, prompt) for c in self.cores]
        best = min(ks, key=lambda k: (-matched[k], outstanding[k], k))
        if prompt and matched[best] / len(prompt) > self.cache_threshold:
            return best
        return min(ks, key=lambda k: (self.cores[k].scheduler.cache.cached_blocks,
                                      outstanding[k], k))


class VllmDp:
    """vLLM 0.33.0's balancing over the data-parallel ranks behind one API server: the lowest
    `intake.dp_score` of max(requests routed there and unfinished, waiting + running), as
    `serve`'s front end scores its ranks; the scan starts one replica later at every call, so
    equal scores go round robin."""

    def __init__(self, cores: Sequence[EngineCore], seed: int = 0) -> None:
        self.cores, self.start = list(cores), 0

    def choose(self, prompt: Sequence[int], outstanding: Sequence[int]) -> int:
        n = len(self.cores)
        best, low = self.start, float("inf")
        for i in range(n):
            k = (self.start + i) % n
            core = self.cores[k]
            waiting = core.scheduler.num_waiting
            score = dp_score(float(max(outstanding[k], waiting + core.scheduler.num_running)),
                             waiting, kv_usage(core) if waiting else 0.0)
            if score < low:
                best, low = k, score
        self.start = (self.start + 1) % n
        return best


class PowerOfTwo:
    """Power of two choices: two distinct replicas drawn at random (seeded), the one with
    fewer outstanding requests wins (Mitzenmacher 2001; the first drawn on a tie)."""

    def __init__(self, cores: Sequence[EngineCore], seed: int = 0) -> None:
        self.n, self.rng = len(cores), random.Random(seed)

    def choose(self, prompt: Sequence[int], outstanding: Sequence[int]) -> int:
        if self.n == 1:
            return 0
        a, b = self.rng.sample(range(self.n), 2)
        return b if outstanding[b] < outstanding[a] else a


ROUTERS = {
    "round-robin": RoundRobin,
    "least-requests": LeastRequests,
    "least-kv": LeastKv,
    "prefix-aware": PrefixAware,
    "p2c": PowerOfTwo,
    "vllm-dp": VllmDp,
}


def make_router(name: str, cores: Sequence[EngineCore], seed: int = 0):
    """The policy `name` over `cores` (ValueError for an unknown name)."""
    try:
        return ROUTERS[name](cores, seed)
    except KeyError:
        raise ValueError(f"unknown router {name!r}; one of {', '.join(ROUTERS)}") from None
