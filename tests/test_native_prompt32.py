"""The prompt-reading product of the Q8_0 / Q5_0 kernels (mode bit 2, ``specdec/native/prompt32.h``).

Its own fixed arithmetic, checked like the scoring kernels: every compiled path (AVX-512 VNNI, AVX2, AVX2 +
AVX-VNNI, scalar) equals the scalar reference (mode 3) bit for bit, on synthetic blocks and on the draft GGUF's
tensors; a row's result is the same alone, inside blocks of any size, at any position, with 1, 2 or 3 threads;
and its accuracy against a float64 product is that of the scoring kernels (same int8 activations, same weights).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_native_draft_kernels import (  # noqa: F401  (avxvnni_kernels: a fixture)
    FORMATS,
    ISAS,
    SHAPES,
    assert_bitwise,
    avxvnni_kernels,
    first_of_type,
    float64_reference,
    kernel,
    random_blocks,
    random_x,
    real_tensor,
)

PROMPT, REFERENCE = 2, 1
EDGE_SHAPES = SHAPES + [(1, 32 * 2), (16, 32 * 3), (17, 32 * 28)]  # one column; one full panel; one column over


def real_cases(name: str) -> list[tuple[str, np.ndarray, int]]:
    """Real tensors of the format: a sample of rows of a large matrix and a whole small one."""
    big = "blk.0.ffn_up.weight" if name == "q5_0" else "output.weight"
    small = first_of_type(name, "attn_v.weight" if name == "q8_0" else "attn_k.weight")
    return [(big, *real_tensor(name, big, rows=200)), (small, *real_tensor(name, small))]


def check_paths(kern, W: np.ndarray, K: int, x: np.ndarray, what: str) -> None:
    ref = kernel(kern.name, "scalar").gemm(W, x, mode=PROMPT | REFERENCE)
    live = ref[np.abs(x).max(axis=1) > 0]  # rows of x that are not all zero
    assert np.count_nonzero(live) >= 0.8 * live.size, what
    assert_bitwise(kern.gemm(W, x, mode=PROMPT | REFERENCE), ref, f"{what} reference ({kern.isa})")
    assert_bitwise(kern.gemm(W, x, mode=PROMPT), ref, f"{what} prompt product ({kern.isa})")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_paths_equal_reference(name, isa):
    kern = kernel(name, isa)
    for s, (N, K) in enumerate(EDGE_SHAPES):
        W = random_blocks(name, N, K, seed=50 + s)
        for k in (1, 7, 8, 9, 17, 40):
            check_paths(kern, W, K, random_x(k, K, seed=60 + k), f"{name} N={N} K={K} k={k}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_paths_equal_reference_real(name, isa):
    for label, W, K in real_cases(name):
        check_paths(kernel(name, isa), W, K, random_x(20, K, seed=7), f"{name} {label}")


@pytest.mark.parametrize("name", FORMATS)
def test_avxvnni_equals_reference(name, request):
    kern = request.getfixturevalue("avxvnni_kernels")[name]
    for s, (N, K) in enumerate(EDGE_SHAPES):
        W = random_blocks(name, N, K, seed=70 + s)
        check_paths(kern, W, K, random_x(19, K, seed=71 + s), f"{name} avx-vnni N={N} K={K}")
    for label, W, K in real_cases(name):
        check_paths(kern, W, K, random_x(11, K, seed=8), f"{name} avx-vnni {label}")


def test_extreme_products():
    """The largest |isum| of each format (all weights -128 / code 0 against activations of +-127)."""
    K = 32 * 4
    x = np.full((9, K), 1.0, dtype=np.float32)
    x[1::2] = -1.0
    for name, code in (("q8_0", 0x80), ("q5_0", 0x00)):
        W = random_blocks(name, 20, K, seed=3).reshape(20, K // 32, -1)
        W[:, :, 2:] = code
        W[:, :, :2] = np.frombuffer(np.float16(0.5).tobytes(), dtype=np.uint8)
        W = W.reshape(20, -1)
        want = np.float32(-128 if name == "q8_0" else -16) * K * np.float32(1 / 127) * 127 * 0.5
        for isa in ISAS:
            y = kernel(name, isa).gemm(W, x, mode=PROMPT)
            assert_bitwise(y, kernel(name, "scalar").gemm(W, x, mode=PROMPT | REFERENCE), f"{name} {isa}")
            assert np.allclose(y[0], want, rtol=1e-6) and np.allclose(y[1], -want, rtol=1e-6), (name, isa, y[:2, 0])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_rows_independent(name, isa):
    kern = kernel(name, isa)
    cases = [("synthetic", random_blocks(name, 45, 32 * 13, seed=9), 32 * 13)]
    if isa != "scalar":
        cases += real_cases(name)
    for label, W, K in cases:
        x = random_x(37, K, seed=11)
        block = kern.gemm(W, x, mode=PROMPT)
        assert_bitwise(kern.gemm(W, x, nthreads=1, mode=PROMPT), block, f"{label} 1 vs 2 threads")
        assert_bitwise(kern.gemm(W, x, nthreads=3, mode=PROMPT), block, f"{label} 3 vs 2 threads")
        for r in (0, 7, 8, 15, 16, 36):  # first, both sides of 8- and 16-row blocks, last
            assert_bitwise(kern.gemm(W, x[r:r + 1], mode=PROMPT)[0], block[r], f"{label} row {r} alone")
        for s, k in ((5, 16), (3, 9), (30, 7)):
            assert_bitwise(kern.gemm(W, x[s:s + k], mode=PROMPT), block[s:s + k], f"{label} rows {s}+{k}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_accuracy_as_scoring(name, isa):
    """Against a float64 product of the kernels' own int8 activations and the file's weights, the prompt
    product is as accurate as the scoring kernels (both round differently, neither is closer by design)."""
    kern = kernel(name, isa)
    cases = [(f"N={N} K={K}", random_blocks(name, N, K, seed=80 + s), K) for s, (N, K) in enumerate(SHAPES)]
    if isa == "native":
        cases += real_cases(name)
    for label, W, K in cases:
        x = random_x(12, K, seed=81)
        exact = float64_reference(kern, W, K, x)
        scale = np.abs(exact).max()
        for mode in (PROMPT, 0):
            y = kern.gemm(W, x, mode=mode).astype(np.float64)
            assert np.linalg.norm(y - exact) / np.linalg.norm(exact) < 1e-5, (label, mode)
            assert np.abs(y - exact).max() <= 1e-5 * scale, (label, mode)
