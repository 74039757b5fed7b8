"""The Q5_K / Q3_K / Q2_K CPU kernels (specdec/native/q5k.cpp, q3k.cpp, q2k.cpp over kgroups.h), scoring (mode 0)
and prompt product (mode 2) alike.

Per type and every build this CPU runs (native, avx2, scalar; an AVX2 + AVX-VNNI build compiled on the side where
the CPU has AVX-VNNI): decoding = gguf.quants.dequantize bit for bit; the activations are the K-quant kernels' one
quantizer (per 256-block, d = amax/127, round half to even, clamp); every path = the scalar reference bit for bit,
and the builds = each other; a row's result the same alone or in blocks of 2..20 at any position, with 1, 2 or 3
threads; against gguf's de-quantized weights times the kernels' own int8 activations in float64, within the stated
float32 rounding; the largest integer dots (every code at an extreme against activations of +-127).
"""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest
from test_native_draft_kernels import AVXVNNI, FLAGS, ISAS, _declare, assert_bitwise, assert_rows_invariant, random_x

from specdec.native import build

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

# name -> (type, bytes per block, offsets of the fp16 d and dmin (None: no min), the code bytes [start, end))
TYPES = {"q5k": (T.Q5_K, 176, 0, 2, (16, 176)), "q3k": (T.Q3_K, 110, 108, None, (0, 96)),
         "q2k": (T.Q2_K, 84, 80, 82, (16, 80))}
SHAPES = [(67, 256 * 5), (33, 256), (20, 256 * 3)]
PROMPT_SHAPES = SHAPES + [(1, 256 * 2), (16, 256), (17, 256 * 4)]  # one column; one full panel; one column over
PROMPT, REFERENCE = 2, 1


class Kernel:
    def __init__(self, name: str, lib: ctypes.CDLL):
        self.name, self.lib = name, _declare(lib, name)
        self.qtype, self.bb = TYPES[name][:2]

    @property
    def isa(self) -> str:
        return getattr(self.lib, f"{self.name}_isa")().decode()

    def gemm(self, W: np.ndarray, x: np.ndarray, *, nthreads: int = 2, mode: int = 0) -> np.ndarray:
        W, x = np.ascontiguousarray(W, dtype=np.uint8), np.ascontiguousarray(x, dtype=np.float32)
        N, K = W.shape[0], x.shape[1]
        assert W.shape[1] == K // 256 * self.bb
        y = np.full((x.shape[0], N), np.nan, dtype=np.float32)
        rc = getattr(self.lib, f"{self.name}_gemm")(W.ctypes.data, N, K, x.ctypes.data, x.shape[0], y.ctypes.data,
                                                   nthreads, mode)
        assert rc == 0
        return y

    def dequant(self, W: np.ndarray, K: int) -> np.ndarray:
        W = np.ascontiguousarray(W, dtype=np.uint8)
        out = np.empty((W.shape[0], K), dtype=np.float32)
        getattr(self.lib, f"{self.name}_dequant")(W.ctypes.data, W.shape[0], K, out.ctypes.data)
        return out

    def quant_x(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.ascontiguousarray(x, dtype=np.float32)
        k, K = x.shape
        a, dx = np.empty((k, K), dtype=np.int8), np.empty((k, K // 256), dtype=np.float32)
        getattr(self.lib, f"{self.name}_quant_x")(x.ctypes.data, k, K, a.ctypes.data, dx.ctypes.data)
        return a, dx


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
    out, folder = {}, tmp_path_factory.mktemp("avxvnni-kq")
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


def builds(name: str, request) -> dict[str, Kernel]:
    out = {isa: kernel(name, isa) for isa in ISAS}
    if AVXVNNI:
        out["avx2+avxvnni"] = request.getfixturevalue("avxvnni_kernels")[name]
    return out


def fp16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(*values.shape, 2)


def random_blocks(name: str, N: int, K: int, seed: int = 0) -> np.ndarray:
    """Random raw blocks (random codes and sub-block scales) with finite, modest fp16 d (some zero, some subnormal,
    some negative) and dmin of both signs (some zero, some subnormal); the first block all codes at their top, the
    last block all codes 0."""
    rng = np.random.default_rng(seed)
    _, bb, at_d, at_m, (c0, c1) = TYPES[name]
    nb = K // 256
    raw = rng.integers(0, 256, size=(N, nb, bb), dtype=np.uint8)
    d = rng.standard_normal((N, nb)) * 0.002
    d.flat[::37] = 0.0
    d.flat[5::41] = 3e-6  # fp16 subnormal
    d.flat[7::43] = -0.15
    raw[:, :, at_d:at_d + 2] = fp16_bytes(d)
    if at_m is not None:
        m = rng.standard_normal((N, nb)) * 0.01
        m.flat[3::29] = 0.0
        m.flat[11::31] = -4e-6
        m.flat[13::47] = 0.2
        raw[:, :, at_m:at_m + 2] = fp16_bytes(m)
    raw[0, 0, c0:c1] = 0xFF
    raw[-1, -1, c0:c1] = 0x00
    return raw.reshape(N, nb * bb)


def np_quant_x(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The K-quant kernels' quantizer in numpy: per 256-block d = amax/127, q = rint(x * (127/amax)) (half to even),
    clamped to [-127, 127] (an all-zero block: d = 0, q = 0)."""
    xb = x.reshape(x.shape[0], -1, 256)
    amax = np.abs(xb).max(axis=-1)
    d = np.where(amax > 0, amax / np.float32(127), np.float32(0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint((xb * inv[..., None]).astype(np.float32))
    return np.clip(q, -127, 127).astype(np.int8).reshape(x.shape), d


def float64_reference(kern: Kernel, W: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, float]:
    """gguf's de-quantized weights times the kernel's own int8 activations a * dx, in float64; and the size of the
    terms the kernels round (|w| |a dx| summed per element: a min can cancel most of a product)."""
    a, dx = kern.quant_x(x)
    xq = (a.astype(np.float64).reshape(x.shape[0], -1, 256) * dx.astype(np.float64)[..., None]).reshape(x.shape)
    w = dequantize(W, kern.qtype).astype(np.float64)
    return xq @ w.T, float((np.abs(xq) @ np.abs(w).T).max())


# ---------------------------------------------------------------- decoding, activations

@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TYPES)
def test_dequant_equals_gguf(name, isa):
    K = 256 * 3
    W = random_blocks(name, 64, K, seed=3)
    want = dequantize(W, TYPES[name][0])
    assert want.shape == (64, K) and want.dtype == np.float32
    assert_bitwise(kernel(name, isa).dequant(W, K), want, f"{name} dequant ({isa})")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TYPES)
def test_activations_are_the_kquant_quantizer(name, isa):
    x = random_x(5, 256 * 3, seed=4)
    x[-1, 256:512] = np.linspace(-127, 127, 256, dtype=np.float32)
    x[-1, 256:261] = [0.5, -0.5, 2.5, -3.5, 126.5]  # 127/amax = 1: exact ties (half to even)
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
    N, K = 40, 256 * 3
    W = random_blocks(name, N, K, seed=7)
    x = random_x(24, K, seed=8)
    assert_rows_invariant(kern, W, x, f"{name} {isa}")


# ---------------------------------------------------------------- accuracy

@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TYPES)
def test_accuracy_vs_float64(name, isa):
    """Per element the kernels round float(I) * d, the min's fma and the fma into the lane once per block (scoring:
    per lane, then 4 levels of lane sums), every rounding at most 2^-24 of the terms' size: at most (3 nb + 8) 2^-24
    of it in all, for the scoring kernels and the prompt product alike."""
    kern = kernel(name, isa)
    for s, (N, K) in enumerate(SHAPES):
        W = random_blocks(name, N, K, seed=40 + s)
        x = random_x(6, K, seed=41 + s)
        ref, scale = float64_reference(kern, W, x)
        for mode in (0, PROMPT):
            y = kern.gemm(W, x, mode=mode).astype(np.float64)
            assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-5, (name, isa, N, K, mode)
            assert np.abs(y - ref).max() <= (3 * K // 256 + 8) * 2.0 ** -24 * scale, (name, isa, N, K, mode)


@pytest.mark.parametrize("name", TYPES)
def test_bad_K(name):
    kern = kernel(name, "native")
    y, x = np.zeros((1, 4), dtype=np.float32), np.zeros((1, 384), dtype=np.float32)
    W = np.zeros((4, 512), dtype=np.uint8)
    for mode in (0, PROMPT):
        assert getattr(kern.lib, f"{name}_gemm")(W.ctypes.data, 4, 384, x.ctypes.data, 1, y.ctypes.data, 1, mode) == -1


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
            for k in (1, 8, 9, 17, 40):
                check_prompt(kern, W, random_x(k, K, seed=60 + k), f"{name} {isa} N={N} K={K} k={k}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", TYPES)
def test_prompt_rows_independent(name, isa):
    kern = kernel(name, isa)
    K = 256 * 3
    W = random_blocks(name, 45, K, seed=9)
    x = random_x(37, K, seed=11)
    block = kern.gemm(W, x, mode=PROMPT)
    assert_bitwise(kern.gemm(W, x, nthreads=1, mode=PROMPT), block, "1 vs 2 threads")
    assert_bitwise(kern.gemm(W, x, nthreads=3, mode=PROMPT), block, "3 vs 2 threads")
    for r in (0, 7, 8, 15, 16, 36):  # first, both sides of 8- and 16-row blocks, last
        assert_bitwise(kern.gemm(W, x[r:r + 1], mode=PROMPT)[0], block[r], f"row {r} alone")
    for s, k in ((5, 16), (3, 9), (30, 7)):
        assert_bitwise(kern.gemm(W, x[s:s + k], mode=PROMPT), block[s:s + k], f"rows {s}+{k}")


@pytest.mark.parametrize("name", TYPES)
def test_extreme_products(name):
    """The largest |integer dot| of each type: every code and scale byte at an extreme against activations of +-127
    (the int16 words of the AVX2 paths and the packed dpbusd sums at their bounds), every build and mode."""
    qtype, bb, at_d, at_m, _ = TYPES[name]
    K = 256 * 2
    x = np.full((9, K), 1.0, dtype=np.float32)
    x[1::2] = -1.0
    half = np.frombuffer(np.float16(0.5).tobytes(), dtype=np.uint8)
    for code in (0x00, 0xFF, 0xAA):
        W = np.full((20, K // 256, bb), code, dtype=np.uint8)
        W[:, :, at_d:at_d + 2] = half
        if at_m is not None:
            W[:, :, at_m:at_m + 2] = half
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
