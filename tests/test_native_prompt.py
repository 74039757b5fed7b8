"""The prompt-reading product of the Q4_K / Q6_K kernels (mode bit 2, ``specdec/native/prompt.h``).

Its own fixed arithmetic, so it is checked like the scoring kernels: every compiled path (AMX where the CPU
has it and the kernel grants the tile state, AVX-512 VNNI, AVX2 with and without AVX-VNNI, scalar) equals
the scalar reference bit for bit; a row's result is the same alone, inside blocks of any size, at any
position, with 1 or 2 threads; integer sums stay exact at the formats' limits; and its accuracy against a
float64 product is that of the scoring kernels (same int8 activations, same weights).
"""

from __future__ import annotations

import numpy as np
import pytest
import test_native_kernels as scoring
from test_native_kernels import FORMATS, ISAS, _cases, activations, same_bits

kernels, real = scoring.kernels, scoring.real  # the scoring kernels' fixtures: the libraries, rows of the real file
vnni_kernels = scoring.vnni_kernels  # the AVX2 build with AVX-VNNI dot products

PROMPT, REFERENCE, NO_AMX = 2, 1, 4


def modes(isa: str) -> list[int]:
    """The prompt-product modes of a build: on the native build both the AMX path (used for more than 32 rows
    where the CPU and the kernel allow it, else the same as NO_AMX) and the AVX-512 VNNI path."""
    return [PROMPT, PROMPT | NO_AMX] if isa == "native" else [PROMPT]


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
            for r in (0, 2, 3, 4, 7, 8, 15, 16, 36):  # the outlier row, both sides of 4-, 8- and 16-row groups
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


@pytest.mark.parametrize("name", FORMATS)
def test_avxvnni_variant(kernels, vnni_kernels, real, name):
    for label, W, K in _cases(real, name):
        for k in (1, 16, 19):
            x = activations(k, K, seed=k + 9)
            ref = kernels[name, "scalar"].gemm(W, K, x, mode=PROMPT | REFERENCE)
            assert same_bits(vnni_kernels[name].gemm(W, K, x, mode=PROMPT), ref), (label, k)


def test_extreme_integers(kernels):
    """Codes, scales and activations at their limits: the integer sums stay exact on every path."""
    from test_native_kernels import fp16_bytes, synthetic
    K, N = 512, 32
    for name in FORMATS:
        W = synthetic(name, N, K, seed=3).reshape(N * K // 256, -1)
        if name == "q4k":
            W[:, 4:16] = 0xFF            # every scale and min 63
            W[:, 16:144] = 0xFF          # every code 15
            W[:, 0:2] = fp16_bytes(np.full(len(W), 0.01))
        else:
            W[:, 0:192] = 0xFF           # every code 63
            W[:, 192:208] = 0x80         # every scale -128
            W[:, 208:210] = fp16_bytes(np.full(len(W), 0.01))
        W = W.reshape(-1)
        x = np.full((40, K), 1.0, np.float32)  # 40 rows: the AMX path too
        x[1::3] = -1.0
        x[2::3, ::2] = -1.0
        ref = kernels[name, "scalar"].gemm(W, K, x, mode=PROMPT | REFERENCE)
        assert np.all(np.isfinite(ref))
        for isa in ISAS:
            for mode in modes(isa):
                assert same_bits(kernels[name, isa].gemm(W, K, x, mode=mode), ref), (name, isa, mode)
