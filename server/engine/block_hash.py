"""vLLM's prefix-cache block hashes, so that KV events name blocks as a vLLM pod names them.

Why this exists: a KV-cache-aware router (llm-d's KV-cache indexer) does not trust the engine's
hashes blindly; it recomputes them from the token ids of a request and looks them up in what
the engine announced. The engine's hashes must therefore be vLLM's, bit for bit
(vLLM 0.33.0: `vllm/v1/core/kv_cache_utils.py` `hash_block_tokens`, `init_none_hash`,
`maybe_convert_block_hash`, `resolve_none_hash_seed`; `vllm/utils/hashing.py`):

- ``hash_fn`` by ``--prefix-caching-hash-algo``: ``sha256`` (the default) is SHA-256 of
  ``pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)``; ``sha256_cbor`` is SHA-256 of
  ``cbor2.dumps(obj, canonical=True)`` (reproducible outside Python). A hash is 32 bytes.
  ``xxhash`` and ``xxhash_cbor`` are XXH3-128 of the same serialisations (16 bytes; faster,
  not collision resistant), and need the ``xxhash`` package, which vLLM keeps optional too.
- the root: ``NONE_HASH = hash_fn(seed)`` with seed ``$PYTHONHASHSEED`` when set, else the fixed
  string ``"vllm-none-hash"`` — for the xxhash pair 32 random bytes per process instead, as
  vLLM draws them (the engine process reads its environment once, at build).
- block i of a sequence (full blocks only): ``h_i = hash_fn((parent, tuple(tokens of block i),
  extra_keys))``, parent ``NONE_HASH`` for i = 0, else ``h_{i-1}``; ``extra_keys`` is
  ``generate_block_hash_extra_keys``' tuple of tagged keys — ``("lora", lora_name,
  lora_path)`` on every block of a LoRA adapter's request, then ``("cache_salt", salt)`` on
  block 0 of a salted one (no multimodal input or prompt embeddings here) — or ``None``
  when there is none (`KvEventLog.hashes` builds them).
- on the wire (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, default 1): the low 64 bits,
  ``int.from_bytes(h, "big") & (2**64 - 1)``, an unsigned integer; with ``0``, the raw bytes.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Sequence
from typing import Any

ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
NON_CRYPTO = ("xxhash", "xxhash_cbor")  # vLLM's _NON_CRYPTO_HASH_FUNCTIONS: random root
DEFAULT_SEED = "vllm-none-hash"
_U64 = (1 << 64) - 1


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    import cbor2  # only deployments that ask for sha256_cbor need it loaded

    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def _xxh3_128() -> Callable[[bytes], bytes]:
    try:
        import xxhash
    except ImportError:
        raise ValueError("xxhash is required for the 'xxhash' prefix caching hash algorithms. "
                         "Install it via `pip install xxhash`.") from None  # vLLM's words
    return xxhash.xxh3_128_digest


def hash_function(algo: str) -> Callable[[Any], bytes]:
    """The hash of ``--prefix-caching-hash-algo``; ValueError names a wrong one, or the
    missing xxhash package."""
    if algo == "sha256":
        return _sha256
    if algo == "sha256_cbor":
        return _sha256_cbor
    if algo in NON_CRYPTO:
        digest = _xxh3_128()
        if algo == "xxhash":
            return lambda obj: digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        import cbor2

        return lambda obj: digest(cbor2.dumps(obj, canonical=True))
    raise ValueError(f"prefix_caching_hash_algo must be one of {', '.join(ALGORITHMS)} "
                     f"(got {algo!r})")


class BlockHasher:
    """One deployment's block hashing: the algorithm, its root and the wire form.

    ``int_hashes`` mirrors ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` (read from the engine's
    environment by ``from_env``)."""

    __slots__ = ("algo", "fn", "int_hashes", "none_hash", "seed")

    def __init__(self, algo: str = "sha256", seed: str = DEFAULT_SEED,
                 int_hashes: bool = True) -> None:
        self.algo, self.fn, self.seed = algo, hash_function(algo), seed
        self.none_hash = self.fn(seed)
        self.int_hashes = int_hashes

    @classmethod
    def from_env(cls, algo: str) -> BlockHasher:
        seed = os.environ.get("PYTHONHASHSEED")
        if seed is None:  # vLLM: a fixed root for SHA-256, a secret one for xxhash
            seed = os.urandom(32).hex() if algo in NON_CRYPTO else DEFAULT_SEED
        int_hashes = os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1") != "0"
        return cls(algo, seed, int_hashes)

    def chain(self, parent: bytes | None, token_ids: Sequence[int], block_size: int,
              extra_keys: tuple[Any, ...] | None = None) -> list[bytes]:
        """The hashes of the full blocks of ``token_ids`` (a whole number of blocks), the first
        block's parent being ``parent`` (``None``: the sequence starts here); ``extra_keys``
        as vLLM's, the same for every block hashed here."""
        out: list[bytes] = []
        prev = parent if parent is not None else self.none_hash
        fn = self.fn
        for i in range(0, len(token_ids) - block_size + 1, block_size):
            prev = fn((prev, tuple(token_ids[i : i + block_size]), extra_keys))
            out.append(prev)
        return out

    def external(self, h: bytes) -> int | bytes:
        """The hash as a KV event carries it."""
        return int.from_bytes(h, "big") & _U64 if self.int_hashes else h


class SglangBlockHasher:
    """SGLang's page hashes, for a pod that imitates SGLang (its KV events name blocks so):
    ``compute_node_hash_values`` / ``get_hash_str`` in ``sglang/srt/mem_cache/utils.py``,
    a SHA-256 chain — page i's digest is SHA-256 of page i-1's 32-byte digest (nothing for the
    first page) followed by each token id as 4 little-endian bytes — and on the wire
    ``hash_str_to_int64``: the digest's first 8 bytes, big-endian, as a signed 64-bit integer.
    No namespace for LoRA adapters (SGLang's events carry ``lora_id`` None)."""

    __slots__ = ()
    algo = "sglang_sha256"

    def chain(self, parent: bytes | None, token_ids: Sequence[int], block_size: int,
              extra_keys: tuple[Any, ...] | None = None) -> list[bytes]:
        out: list[bytes] = []
        prev = parent
        for i in range(0, len(token_ids) - block_size + 1, block_size):
            h = hashlib.sha256(prev) if prev is not None else hashlib.sha256()
            h.update(b"".join(t.to_bytes(4, "little") for t in token_ids[i:i + block_size]))
            prev = h.digest()
            out.append(prev)
        return out

    def external(self, h: bytes) -> int:
        return int.from_bytes(h[:8], "big", signed=True)
