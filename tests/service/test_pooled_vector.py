"""The emulated pooled vector (server/frontend/pooled.py) and vLLM's encodings of it: unit length,
the same in every process, its cosine following the prompts' bag-of-tokens cosine, Matryoshka
truncation then normalisation; float16, bfloat16 and both FP8 formats as torch writes them."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest

from server.frontend.pooled import binary, cosine, pooled_vector


def bag_cosine(a: list[int], b: list[int]) -> float:
    ca, cb = np.bincount(a, minlength=200_000), np.bincount(b, minlength=200_000)
    return float(ca @ cb / np.linalg.norm(ca) / np.linalg.norm(cb))


@pytest.mark.parametrize("size", [1024, 2560, 4096])
def test_cosine_follows_the_bag_of_tokens(size):
    rng, errors = random.Random(size), []
    for _ in range(300):
        common = [rng.randrange(1, 150_000) for _ in range(rng.randrange(0, 5))]
        a = common + [rng.randrange(1, 150_000) for _ in range(rng.randrange(1, 12))]
        b = common + [rng.randrange(1, 150_000) for _ in range(rng.randrange(1, 12))]
        va, vb = pooled_vector(a, size), pooled_vector(b, size)
        assert va.shape == (size,) and va.dtype == np.float32
        assert np.linalg.norm(va) == pytest.approx(1, abs=1e-5)
        errors.append(abs(cosine(va, vb) - bag_cosine(a, b)))
    assert np.mean(errors) < 0.03 and max(errors) < 0.3


def test_the_same_prompt_is_the_same_vector_in_another_process():
    ids = [11, 2024, 7, 150_000]
    here = pooled_vector(ids, 1024)
    code = ("import sys; from server.frontend.pooled import pooled_vector; "
            "sys.stdout.write(pooled_vector([11, 2024, 7, 150000], 1024).tobytes().hex())")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout
    assert there == here.tobytes().hex()


def test_dimensions_cut_then_normalise_and_raw_vectors_are_not_unit():
    full = pooled_vector([1, 2, 3, 4], 1024, normalize=False)
    cut = pooled_vector([1, 2, 3, 4], 1024, dimensions=64)
    assert np.allclose(cut, full[:64] / np.linalg.norm(full[:64]), atol=1e-6)
    assert np.linalg.norm(pooled_vector(list(range(50)), 1024, normalize=False)) != \
        pytest.approx(1, abs=1e-3)


def test_encodings_are_torchs():
    v = np.array([0.5, -0.25, 0.1, 1e-3, 300.0], dtype=np.float32)
    # float8_e4m3fn: bias 7, 3 mantissa bits; 0.1 → 0.1015625, 1e-3 → the least subnormal
    assert binary(v, "fp8_e4m3", "native") == bytes([0x30, 0xA8, 0x1D, 0x01, 0x79])
    # float8_e5m2: bias 15, 2 mantissa bits
    assert binary(v[:3], "fp8_e5m2", "native") == bytes([0x38, 0xB4, 0x2E])
    assert binary(v[:2], "bfloat16", "little") == bytes([0x00, 0x3F, 0x80, 0xBE])
    assert binary(np.array([1 + 2**-8 + 2**-9], np.float32), "bfloat16", "big") == \
        bytes([0x3F, 0x81])  # rounded to nearest (up past the half)
    assert binary(v[:1], "float16", "big") == bytes([0x38, 0x00])
    assert binary(v[:1], "float32", "big") == bytes([0x3F, 0x00, 0x00, 0x00])


def test_special_tokens_are_no_likeness():
    from server.engine.interface import PoolingParams
    from server.frontend.pooled import prompt_vector

    bos, params = 1, PoolingParams()
    a, b = [bos, 500, 600], [bos, 700, 800]
    assert np.array_equal(prompt_vector(a, 1024, params, frozenset({bos})),
                          prompt_vector([500, 600], 1024, params))
    # with BOS counted, two unrelated prompts would look a third alike
    assert cosine(prompt_vector(a, 1024, params), prompt_vector(b, 1024, params)) > 0.2
    assert abs(cosine(prompt_vector(a, 1024, params, frozenset({bos})),
                      prompt_vector(b, 1024, params, frozenset({bos})))) < 0.15
    assert np.array_equal(prompt_vector([bos], 1024, params, frozenset({bos})),
                          prompt_vector([bos], 1024, params))  # nothing else: itself
