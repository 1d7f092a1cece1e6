"""The emulated pooled vector of a prompt — what an embedding model's pooler would return — and
vLLM 0.33.0's encodings of it (`vllm/utils/serial_utils.py`, `entrypoints/pooling/utils.py`).

No model runs, so the vector is made from the prompt's token ids, in a way that keeps what
clients use embeddings for: texts that share tokens are close, the same text is the same
vector on every pod and in every process. Each token id adds ±1 to `HASHES` of N hashed
buckets (a count sketch of the prompt's bag of tokens; N the power of two at or above the
vector's size, at least `MIN_BUCKETS`). Two rounds of a randomized Walsh–Hadamard transform
(fixed, seeded sign flips) spread the sketch over every entry: the transform is orthogonal,
so the cosine of two vectors is the cosine of the two sketches — that of the prompts' token
counts, within about 0.01 on average for short texts (`tests/service/test_pooled_vector.py`) — and
entries look Gaussian rather than sparse. A size that is not a power of two keeps the first
entries (a subsampled randomized Hadamard transform, which keeps inner products
approximately). ASSUMPTION: a real model's vectors follow meaning, not tokens; the emulation
keeps the shape (length, norm, determinism) and that overlap ranks first.

As vLLM's pooler: `dimensions` (Matryoshka) keeps the first entries, then the vector is
normalised when `use_activation` (the default for `embed`); with it off, the raw vector.
"""

from __future__ import annotations

import base64
import functools
import sys
from collections.abc import Sequence

import numpy as np

from server.engine.interface import PoolingParams

MIN_BUCKETS = 1024  # count-sketch buckets at least (fewer collisions between short texts)
HASHES = 2  # buckets each token id adds to
_SEEDS = np.array([0x9E3779B97F4A7C15, 0x3C6EF372FE94F82A], dtype=np.uint64)[:HASHES]


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every output bit depends on every input bit (uint64, wraps)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@functools.cache
def _signs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The two fixed ±1 sign flips of the n-point randomized Hadamard transforms."""
    rng = np.random.default_rng(0x5EED0000 + n)
    return tuple(np.where(rng.random(n) < 0.5, -1.0, 1.0) for _ in range(2))  # type: ignore


def _fwht(a: np.ndarray) -> np.ndarray:
    """The orthonormal Walsh–Hadamard transform of a power-of-two-long vector."""
    n, h = a.shape[0], 1
    while h < n:
        pairs = a.reshape(-1, 2, h)
        a = np.stack((pairs[:, 0] + pairs[:, 1], pairs[:, 0] - pairs[:, 1]), axis=1).reshape(n)
        h *= 2
    return a / np.sqrt(n)


def _sketch(ids: Sequence[int], n: int) -> np.ndarray:
    """The count sketch of a bag of token ids (n floats)."""
    x = _mix(np.asarray(ids, dtype=np.uint64)[:, None] + _SEEDS[None, :])  # a hash per column
    buckets = (x % np.uint64(n)).astype(np.int64).ravel()
    signs = np.where((x >> np.uint64(63)) & np.uint64(1), 1.0, -1.0).ravel()
    return np.bincount(buckets, weights=signs, minlength=n)


def pooled_vector(ids: Sequence[int], size: int, dimensions: int | None = None,
                  normalize: bool = True) -> np.ndarray:
    """The prompt's vector (float32): `size` entries, or its first `dimensions`."""
    n = max(MIN_BUCKETS, 1 << max(0, size - 1).bit_length())
    first, second = _signs(n)
    v = _fwht(second * _fwht(first * _sketch(ids, n) / np.sqrt(max(1, len(ids)))))[:size]
    if dimensions is not None:
        v = v[:dimensions]
    if normalize:
        norm = float(np.linalg.norm(v))
        v = v / norm if norm > 0 else v
    return v.astype(np.float32)


def text_vector(ids: Sequence[int], size: int, special: frozenset[int] = frozenset(),
                dimensions: int | None = None, normalize: bool = True) -> np.ndarray:
    """A text's vector, made from its tokens but its `special` ones (a BOS every prompt
    shares is no likeness)."""
    return pooled_vector([t for t in ids if t not in special] or list(ids), size, dimensions,
                         normalize)


def prompt_vector(ids: Sequence[int], size: int, params: PoolingParams,
                  special: frozenset[int] = frozenset()) -> np.ndarray:
    """A pooling request's answer: its prompt's `text_vector` as `params` ask it."""
    return text_vector(ids, size, special, params.dimensions, params.use_activation)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """torch's `cosine_similarity` of two vectors (norms clamped at 1e-8), vLLM's bi-encoder
    score."""
    na, nb = max(float(np.linalg.norm(a)), 1e-8), max(float(np.linalg.norm(b)), 1e-8)
    return float(np.dot(a.astype(np.float64), b.astype(np.float64)) / (na * nb))


# -- encodings (vLLM's EMBED_DTYPES and endianness) ----------------------------------------------
EMBED_DTYPES = ("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2")


@functools.cache
def _fp8_table(exponent_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Every finite value of an FP8 format, sorted, and its byte: e4m3 is torch's
    float8_e4m3fn (bias 7, no infinities, 0x7F/0xFF NaN), e5m2 IEEE-like (bias 15)."""
    mant_bits = 7 - exponent_bits
    bias = (1 << (exponent_bits - 1)) - 1
    values, codes = [], []
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e, m = (code >> mant_bits) & ((1 << exponent_bits) - 1), code & ((1 << mant_bits) - 1)
        if exponent_bits == 4 and e == 15 and m == 7:
            continue  # NaN
        if exponent_bits == 5 and e == 31:
            continue  # infinities and NaNs
        value = (m / (1 << mant_bits)) * 2.0 ** (1 - bias) if e == 0 else \
            (1 + m / (1 << mant_bits)) * 2.0 ** (e - bias)
        values.append(sign * value)
        codes.append(code)
    order = np.argsort(values, kind="stable")
    return np.asarray(values)[order], np.asarray(codes, dtype=np.uint8)[order]


def _to_fp8(v: np.ndarray, exponent_bits: int) -> np.ndarray:
    """Each value's nearest FP8 byte. (Past the format's largest finite value, clamped to it;
    the entries of a pooled vector are far below: 448 for e4m3, 57,344 for e5m2.)"""
    table, codes = _fp8_table(exponent_bits)
    x = np.clip(v.astype(np.float64), table[0], table[-1])
    hi = np.clip(np.searchsorted(table, x), 1, len(table) - 1)
    lo = hi - 1
    nearest = np.where(np.abs(table[hi] - x) < np.abs(x - table[lo]), hi, lo)
    return codes[nearest]


def binary(v: np.ndarray, embed_dtype: str, endianness: str) -> bytes:
    """The vector's bytes in `embed_dtype` (vLLM's `tensor2binary`); `native` is this
    machine's order."""
    if embed_dtype == "float32":
        out = v.astype(np.float32)
    elif embed_dtype == "float16":
        out = v.astype(np.float16)
    elif embed_dtype == "bfloat16":  # float32's top half, rounded to nearest even
        bits = v.astype(np.float32).view(np.uint32)
        out = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
               >> np.uint32(16)).astype(np.uint16)
    else:
        return _to_fp8(v, 4 if embed_dtype == "fp8_e4m3" else 5).tobytes()
    if endianness not in ("native", sys.byteorder):
        out = out.byteswap()
    return out.tobytes()


def encode_base64(v: np.ndarray, embed_dtype: str, endianness: str) -> str:
    return base64.b64encode(binary(v, embed_dtype, endianness)).decode()
