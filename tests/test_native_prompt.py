"""The prompt-reading product of the Q4_K / Q6_K kernels (mode bit 2, ``specdec/native/prompt.h``).

Its own fixed arithmetic, so it is checked like the scoring kernels: every compiled path (AVX-512 VNNI,
AVX2, scalar) equals the scalar reference bit for bit; a row's result is
the same alone, inside blocks of any size, at any position, with 1 or 2 threads; and its accuracy against a
float64 product is that of the scoring kernels (same int8 activations, same weights).
"""

from __future__ import annotations

import numpy as np
import pytest
import test_native_kernels as scoring
from test_native_kernels import FORMATS, ISAS, _cases, activations, same_bits

kernels, real = scoring.kernels, scoring.real  # the scoring kernels' fixtures: the libraries, rows of the real file

PROMPT, REFERENCE = 2, 1


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_paths_equal_reference(kernels, real, name, isa):
    for label, W, K in _cases(real, name):
        for k in (1, 5, 16, 17, 40):
            x = activations(k, K, seed=k + 3)
            ref = kernels[name, "scalar"].gemm(W, K, x, mode=PROMPT | REFERENCE)
            assert np.count_nonzero(ref) > 0.9 * ref.size
            assert same_bits(kernels[name, isa].gemm(W, K, x, mode=PROMPT | REFERENCE), ref), (label, k)
            assert same_bits(kernels[name, isa].gemm(W, K, x, mode=PROMPT), ref), (label, k, isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_rows_independent(kernels, real, name, isa):
    kern = kernels[name, isa]
    for label, W, K in _cases(real, name):
        x = activations(37, K, seed=11)
        block = kern.gemm(W, K, x, mode=PROMPT)
        assert same_bits(kern.gemm(W, K, x, nthreads=1, mode=PROMPT), block), label
        for r in (0, 2, 7, 8, 15, 16, 36):  # first, the outlier row, both sides of 8- and 16-row groups, last
            assert same_bits(kern.gemm(W, K, x[r:r + 1], mode=PROMPT)[0], block[r]), (label, r)
        assert same_bits(kern.gemm(W, K, x[5:21], mode=PROMPT), block[5:21]), label


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
