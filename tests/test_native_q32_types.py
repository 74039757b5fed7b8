"""The Q4_0 / Q4_1 / Q5_1 / IQ4_NL CPU kernels (specdec/native/q4_0.cpp, q4_1.cpp, q5_1.cpp, iq4_nl.cpp: q32.h's
shape, as Q5_0 / Q8_0), scoring (mode 0) and prompt product (mode 2) alike.

Per type and every build this CPU runs (native, avx2, scalar; an AVX2 + AVX-VNNI build compiled on the side where
the CPU has AVX-VNNI): decoding = gguf.quants.dequantize bit for bit; the activations are q32.h's one quantizer
(ggml's quantize_row_q8_0_ref); every path = the scalar reference bit for bit, and the builds = each other; a row's
result the same alone or in blocks of 2..20 at any position, with 1, 2 or 3 threads; against gguf's de-quantized
weights times the kernels' own int8 activations in float64, within the stated float32 rounding. Q4_1 and Q5_1 (a
min per block: w = d * q + m) with mins of both signs, zero and subnormal.
"""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest
from test_native_draft_kernels import (
    AVXVNNI,
    FLAGS,
    ISAS,
    _declare,
    assert_bitwise,
    assert_rows_invariant,
    np_quant_x,
    random_x,
)
from test_native_draft_kernels import Kernel as DraftKernel

from specdec.native import build

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

TYPES = {"q4_0": (T.Q4_0, 18), "q4_1": (T.Q4_1, 20), "q5_1": (T.Q5_1, 24), "iq4_nl": (T.IQ4_NL, 18)}
MINS = {"q4_1", "q5_1"}  # w = d * q + m: fp16 m at bytes 2..3
SHAPES = [(67, 32 * 28), (45, 32 * 7), (33, 32 * 1), (20, 32 * 13)]  # K/32 = 28, 7 (tail 3), 1, 13 (tail 1)
PROMPT_SHAPES = SHAPES + [(1, 32 * 2), (16, 32 * 3), (17, 32 * 28)]  # one column; one full panel; one column over
PROMPT, REFERENCE = 2, 1


class Kernel(DraftKernel):
    """test_native_draft_kernels' wrapper of one type's library, for the types here (and their gguf type)."""

    def __init__(self, name: str, lib: ctypes.CDLL):
        self.name, self.lib = name, _declare(lib, name)
        self.qtype, self.bb = TYPES[name]


_kernels: dict[tuple[str, str], Kernel] = {}


def kernel(name: str, isa: str) -> Kernel:
    if (name, isa) not in _kernels:
        _kernels[(name, isa)] = Kernel(name, build.load(name, isa))
    return _kernels[(name, isa)]


@pytest.fixture(scope="module")
def avxvnni_kernels(tmp_path_factory) -> dict[str, Kernel]:
    """AVX2 + AVX-VNNI builds (compiled here: build.py's isas do not pick that path on an AVX-512 CPU)."""
    cxx = build.compiler()
    if not AVXVNNI or cxx is None:
        pytest.skip("CPU without AVX-VNNI or no compiler")
    out, folder = {}, tmp_path_factory.mktemp("avxvnni-q32")
    for name in TYPES:
        so = folder / f"lib{name}.so"
        cmd = [cxx, *build.COMMON_FLAGS, "-march=x86-64-v3", "-mf16c", "-mavxvnni", "-I", str(build.HERE),
               "-o", str(so), str(build.HERE / f"{name}.cpp")]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"compiler without -mavxvnni: {done.stderr[-300:]}")
        import torch  # noqa: F401  (same OpenMP runtime order as build.load)

        out[name] = Kernel(name, ctypes.CDLL(str(so)))
    return out


def fp16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(*values.shape, 2)


def random_blocks(name: str, N: int, K: int, seed: int = 0) -> np.ndarray:
    """Random raw blocks with finite, modest fp16 scales (some zero, some subnormal, some negative) and, for the
    types with a min, mins of both signs (some zero, some subnormal); the first block all codes at their top, the
    last block all codes 0."""
    rng = np.random.default_rng(seed)
    bb, nb = TYPES[name][1], K // 32
    raw = rng.integers(0, 256, size=(N, nb, bb), dtype=np.uint8)
    d = rng.standard_normal((N, nb)) * 0.02
    d.flat[::37] = 0.0
    d.flat[5::41] = 3e-6  # fp16 subnormal
    d.flat[7::43] = -1.5
    raw[:, :, 0:2] = fp16_bytes(d)
    start = 2
    if name in MINS:
        m = rng.standard_normal((N, nb)) * 0.15
        m.flat[3::29] = 0.0
        m.flat[11::31] = -4e-6
        m.flat[13::47] = 2.0
        raw[:, :, 2:4] = fp16_bytes(m)
        start = 4
    raw[0, 0, start:] = 0xFF
    raw[-1, -1, start:] = 0x00
    return raw.reshape(N, nb * bb)


def float64_reference(kern: Kernel, W: np.ndarray, x: np.ndarray) -> np.ndarray:
    """gguf's de-quantized weights times the kernel's own int8 activations a * dx, in float64."""
    a, dx = kern.quant_x(x)
    xq = (a.astype(np.float64).reshape(x.shape[0], -1, 32) * dx.astype(np.float64)[..., None]).reshape(x.shape)
    return xq @ dequantize(W, kern.qtype).astype(np.float64).T


def pieces_scale(kern: Kernel, W: np.ndarray, x: np.ndarray) -> float:
    """The size of the terms the kernels round (|d q| |a dx| and |m| |a dx| summed per element): the float32
    rounding bound is relative to it (a min can cancel most of a product)."""
    a, dx = kern.quant_x(x)
    xq = np.abs((a.astype(np.float64).reshape(x.shape[0], -1, 32) * dx.astype(np.float64)[..., None]).reshape(x.shape))
    return float((xq @ np.abs(dequantize(W, kern.qtype).astype(np.float64)).T).max())


# ---------------------------------------------------------------- decoding, activations

@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TYPES)
def test_dequant_equals_gguf(name, isa):
    K = 32 * 7
    W = random_blocks(name, 64, K, seed=3)
    want = dequantize(W, TYPES[name][0])
    assert want.shape == (64, K) and want.dtype == np.float32
    assert_bitwise(kernel(name, isa).dequant(W, K), want, f"{name} dequant ({isa})")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TYPES)
def test_activations_are_the_shared_quantizer(name, isa):
    x = random_x(5, 32 * 9, seed=4)
    x[-1, 32:64] = 127.0
    x[-1, 33:38] = [0.5, -0.5, 2.5, -3.5, 126.5]  # dx = 1: exact ties (roundf: away from zero)
    a, dx = kernel(name, isa).quant_x(x)
    a2, dx2 = np_quant_x(x)
    assert_bitwise(dx, dx2, "dx")
    assert np.array_equal(a, a2)


# ---------------------------------------------------------------- paths and builds agree

@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TYPES)
def test_fast_path_equals_reference(name, isa):
    kern = kernel(name, isa)
    expected = {"native": None, "scalar": "scalar", "avx2": "avx2"}[isa]
    if expected:
        assert kern.isa == expected
    if isa == "native" and {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi"} <= FLAGS:
        assert kern.isa == "avx512-vnni"
    for s, (N, K) in enumerate(SHAPES):
        W = random_blocks(name, N, K, seed=10 + s)
        for k in (1, 3, 16, 17):
            x = random_x(k, K, seed=20 + k)
            assert_bitwise(kern.gemm(W, x, mode=0), kern.gemm(W, x, mode=1), f"{name} {isa} N={N} K={K} k={k}")


def builds(name: str, request) -> dict[str, Kernel]:
    out = {isa: kernel(name, isa) for isa in ISAS}
    if AVXVNNI:
        out["avx2+avxvnni"] = request.getfixturevalue("avxvnni_kernels")[name]
    return out


@pytest.mark.parametrize("name", TYPES)
def test_isa_builds_equal(name, request):
    kerns = builds(name, request)
    for s, (N, K) in enumerate(SHAPES):
        W = random_blocks(name, N, K, seed=30 + s)
        x = random_x(19, K, seed=31 + s)
        ref = kerns["native"].gemm(W, x)
        for isa, kern in kerns.items():
            assert_bitwise(kern.gemm(W, x), ref, f"{name} {isa} vs native, N={N} K={K}")
            assert_bitwise(kern.gemm(W, x, mode=1), ref, f"{name} {isa} reference vs native")


# ---------------------------------------------------------------- invariance

@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TYPES)
def test_rows_batch_and_thread_invariant(name, isa):
    kern = kernel(name, isa)
    N, K = 96, 32 * 29
    W = random_blocks(name, N, K, seed=7)
    x = random_x(24, K, seed=8)
    assert_rows_invariant(kern, W, x, f"{name} {isa}")


# ---------------------------------------------------------------- accuracy

@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TYPES)
def test_accuracy_vs_float64(name, isa):
    """Per element the kernels round S = d * dx (and M = m * dx) and each fma once per block (scoring: per lane,
    then 4 levels of lane sums), every rounding at most 2^-24 of the terms' size: at most (3 nb + 8) 2^-24 of it in
    all, for the scoring kernels and the prompt product alike."""
    kern = kernel(name, isa)
    for s, (N, K) in enumerate(SHAPES):
        W = random_blocks(name, N, K, seed=40 + s)
        x = random_x(6, K, seed=41 + s)
        ref, scale = float64_reference(kern, W, x), pieces_scale(kern, W, x)
        for mode in (0, PROMPT):
            y = kern.gemm(W, x, mode=mode).astype(np.float64)
            assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-5, (name, isa, N, K, mode)
            assert np.abs(y - ref).max() <= (3 * K // 32 + 8) * 2.0 ** -24 * scale, (name, isa, N, K, mode)


@pytest.mark.parametrize("name", TYPES)
def test_bad_K(name):
    kern = kernel(name, "native")
    y, x = np.zeros((1, 4), dtype=np.float32), np.zeros((1, 48), dtype=np.float32)
    W = np.zeros((4, 64), dtype=np.uint8)
    assert getattr(kern.lib, f"{name}_gemm")(W.ctypes.data, 4, 48, x.ctypes.data, 1, y.ctypes.data, 1, 0) == -1


# ---------------------------------------------------------------- the prompt product (mode bit 2)

def check_prompt(kern: Kernel, W: np.ndarray, x: np.ndarray, what: str) -> None:
    ref = kernel(kern.name, "scalar").gemm(W, x, mode=PROMPT | REFERENCE)
    live = ref[np.abs(x).max(axis=1) > 0]
    assert np.count_nonzero(live) >= 0.8 * live.size, what
    assert_bitwise(kern.gemm(W, x, mode=PROMPT | REFERENCE), ref, f"{what} reference ({kern.isa})")
    assert_bitwise(kern.gemm(W, x, mode=PROMPT), ref, f"{what} prompt product ({kern.isa})")


@pytest.mark.parametrize("name", TYPES)
def test_prompt_paths_equal_reference(name, request):
    for isa, kern in builds(name, request).items():
        for s, (N, K) in enumerate(PROMPT_SHAPES):
            W = random_blocks(name, N, K, seed=50 + s)
            for k in (1, 7, 8, 9, 17, 40):
                check_prompt(kern, W, random_x(k, K, seed=60 + k), f"{name} {isa} N={N} K={K} k={k}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TYPES)
def test_prompt_rows_independent(name, isa):
    kern = kernel(name, isa)
    K = 32 * 13
    W = random_blocks(name, 45, K, seed=9)
    x = random_x(37, K, seed=11)
    block = kern.gemm(W, x, mode=PROMPT)
    assert_bitwise(kern.gemm(W, x, nthreads=1, mode=PROMPT), block, "1 vs 2 threads")
    assert_bitwise(kern.gemm(W, x, nthreads=3, mode=PROMPT), block, "3 vs 2 threads")
    for r in (0, 7, 8, 15, 16, 36):  # first, both sides of 8- and 16-row blocks, last
        assert_bitwise(kern.gemm(W, x[r:r + 1], mode=PROMPT)[0], block[r], f"row {r} alone")
    for s, k in ((5, 16), (3, 9), (30, 7)):
        assert_bitwise(kern.gemm(W, x[s:s + k], mode=PROMPT), block[s:s + k], f"rows {s}+{k}")


def test_extreme_products():
    """The largest |integer dot| of each type: every code at its extreme against activations of +-127 (the
    int16 sums of the AVX2 paths and the biased dpbusd sums at their bounds), every build and mode."""
    K = 32 * 8
    x = np.full((9, K), 1.0, dtype=np.float32)
    x[1::2] = -1.0
    half = np.frombuffer(np.float16(0.5).tobytes(), dtype=np.uint8)
    for name, (qtype, bb) in TYPES.items():
        for code in (0x00, 0xFF, 0x88):
            W = random_blocks(name, 20, K, seed=3).reshape(20, K // 32, bb)
            W[:, :, 4 if name in MINS else 2:] = code
            W[:, :, 0:2] = half
            W = W.reshape(20, -1)
            w = dequantize(W, qtype).astype(np.float64)  # a = +-127, dx = 1/127 (float32)
            want, scale = w.sum(axis=1) * 127 * np.float64(np.float32(1) / np.float32(127)), np.abs(w).sum(axis=1).max()
            for isa in ISAS:
                kern = kernel(name, isa)
                for mode in (0, PROMPT):
                    y = kern.gemm(W, x, mode=mode)
                    assert_bitwise(y, kernel(name, "scalar").gemm(W, x, mode=mode | REFERENCE), f"{name} {isa} {mode}")
                    err = max(np.abs(y[0] - want).max(), np.abs(y[1] + want).max())
                    assert err <= 1e-6 * scale, (name, code, isa, mode, err, scale)
