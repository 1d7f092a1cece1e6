"""The OS page cache over an mmapped model file, as an LRU at chunk granularity.

llama.cpp mmaps the GGUF file: pages come from SSD on first touch and stay in RAM while it has
room. Every decode step reads the CPU-resident layers in the same order, a cyclic scan, so the
steady state of an LRU cache is computed by simulating the scan until it repeats. (A cyclic scan
larger than an LRU cache misses on every access: a file that exceeds free RAM is re-read from
SSD on every token.)
"""

from __future__ import annotations

from collections import OrderedDict

CHUNK_BYTES = 256e6  # simulation granularity (a chunk of a layer); the result barely depends on it


def steady_state_miss_bytes(chunk_sizes: list[float], cache_bytes: float) -> float:
    """Bytes read from SSD per full pass over ``chunk_sizes``, in steady state, with LRU."""
    total = sum(chunk_sizes)
    if total <= cache_bytes:
        return 0.0
    cache: OrderedDict[int, float] = OrderedDict()
    used = 0.0
    missed = 0.0
    for rnd in range(3):  # warm-up passes, then measure the last
        missed = 0.0
        for i, size in enumerate(chunk_sizes):
            if i in cache:
                cache.move_to_end(i)
                continue
            missed += size
            while cache and used + size > cache_bytes:
                _, old = cache.popitem(last=False)
                used -= old
            if size <= cache_bytes:
                cache[i] = size
                used += size
        if rnd == 2:
            break
    return missed


def chunks_of(layer_bytes: list[float], chunk: float = CHUNK_BYTES) -> list[float]:
    """Split each layer's bytes into chunks of at most ``chunk`` bytes, in file order."""
    out: list[float] = []
    for b in layer_bytes:
        n = max(1, int(-(-b // chunk)))
        out.extend([b / n] * n)
    return out
