"""The prompt-reading product of the Q4_K / Q6_K kernels (mode bit 2, ``specdec/native/prompt.h``).

Its own fixed arithmetic, so it is checked like the scoring kernels: every compiled path (AMX where the CPU
and kernel allow it, AVX-512 VNNI, AVX2, scalar) equals the scalar reference bit for bit; a row's result is
the same alone, inside blocks of any size, at any position, with 1 or 2 threads; and its accuracy against a
float64 product is that of the scoring kernels (same int8 activations, same weights).
"""

from __future__ import annotations

import numpy as np
import pytest

from test_native_kernels import (  # noqa: F401  (kernels, real: fixtures)
    FLAGS, FORMATS, ISAS, _cases, activations, kernels, real, same_bits,
)

PROMPT, REFERENCE, NO_AMX, AMX = 2, 1, 4, 8
AMX_FLAGS = {"amx_tile", "amx_int8", "avx512_vnni"}


def modes(isa: str) -> list[int]:
    """The prompt-product modes worth running on this build: the default, and on AVX-512 both AMX on and off."""
    if isa == "native" and "avx512_vnni" in FLAGS:
        return [PROMPT, PROMPT | NO_AMX, PROMPT | AMX]
    return [PROMPT]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_paths_equal_reference(kernels, real, name, isa):
    for label, W, K in _cases(real, name):
        for k in (1, 5, 16, 17, 40):
            x = activations(k, K, seed=k + 3)
            ref = kernels[name, "scalar"].gemm(W, K, x, mode=PROMPT | REFERENCE)
            assert np.count_nonzero(ref) > 0.9 * ref.size
            assert same_bits(kernels[name, isa].gemm(W, K, x, mode=PROMPT | REFERENCE), ref), (label, k)
            for mode in modes(isa):
                assert same_bits(kernels[name, isa].gemm(W, K, x, mode=mode), ref), (label, k, isa, mode)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_rows_independent(kernels, real, name, isa):
    kern = kernels[name, isa]
    for label, W, K in _cases(real, name):
        x = activations(37, K, seed=11)
        for mode in modes(isa):
            block = kern.gemm(W, K, x, mode=mode)
            assert same_bits(kern.gemm(W, K, x, nthreads=1, mode=mode), block), (label, mode)
            for r in (0, 2, 15, 16, 36):  # first, the outlier row, both sides of a 16-row tile, last
                assert same_bits(kern.gemm(W, K, x[r:r + 1], mode=mode)[0], block[r]), (label, mode, r)
            assert same_bits(kern.gemm(W, K, x[5:21], mode=mode), block[5:21]), (label, mode)


@pytest.mark.parametrize("name", FORMATS)
def test_accuracy_as_scoring(kernels, real, name):
    """Against a float64 product of the kernel's own int8 activations and the file's weights, the prompt
    product is as accurate as the scoring kernels (both round differently, neither is closer by design)."""
    kern = kernels[name, "native"]
    for label, W, K in _cases(real, name):
        x = activations(24, K, seed=5)
        a, dx = kern.quant_x(x)
        w = kern.dequant(W, K).astype(np.float64)
        exact = (a.astype(np.float64) * np.repeat(dx, 256, axis=1)) @ w.T
        scale = np.abs(exact).max()
        err_prompt = np.abs(kern.gemm(W, K, x, mode=PROMPT) - exact).max() / scale
        err_score = np.abs(kern.gemm(W, K, x, mode=0) - exact).max() / scale
        assert err_prompt < 1e-5 and err_score < 1e-5, (label, err_prompt, err_score)
