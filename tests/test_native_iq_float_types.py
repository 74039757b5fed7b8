"""The IQ4_XS, F16 and BF16 CPU kernels (specdec/native/iq4_xs.cpp: q32.h's arithmetic over 256-weight superblocks;
f16.cpp, bf16.cpp over half.h: f32.cpp's arithmetic on the 16-bit weights as stored).

Per type and every build this CPU runs (native, avx2, scalar; for IQ4_XS an AVX2 + AVX-VNNI build compiled on the
side where the CPU has AVX-VNNI): decoding = gguf.quants.dequantize bit for bit; every path = the scalar reference
bit for bit, and the builds = each other; a row's result the same alone or in blocks of 2..20 at any position, with
1, 2 or 3 threads; the prompt product (mode 2) likewise. IQ4_XS: the activations are q32.h's quantizer, the result
within the stated float32 rounding of gguf's weights times those activations in float64, the extreme codes and
sub-block scales at their integer bounds. F16 / BF16: the result is f32.cpp's on gguf's de-quantized weights, bit
for bit, for every mode and build, with the largest finite values, subnormals and infinities among the weights.
"""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest
from test_native_draft_kernels import AVXVNNI, FLAGS, ISAS, assert_bitwise, assert_rows_invariant, np_quant_x, random_x

from specdec.native import build

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

PROMPT, REFERENCE = 2, 1
BYTES = {"iq4_xs": 17 / 32, "f16": 2, "bf16": 2, "f32": 4}  # bytes a weight
QTYPE = {"iq4_xs": T.IQ4_XS, "f16": T.F16, "bf16": T.BF16}
_p, _i = ctypes.c_void_p, ctypes.c_int


class Kernel:
    def __init__(self, name: str, lib: ctypes.CDLL):
        self.name, self.lib = name, lib
        self._gemm = getattr(lib, f"{name}_gemm")
        self._gemm.argtypes, self._gemm.restype = [_p, _i, _i, _p, _i, _p, _i, _i], _i
        getattr(lib, f"{name}_isa").restype = ctypes.c_char_p
        if name != "f32":
            getattr(lib, f"{name}_dequant").argtypes = [_p, _i, _i, _p]
        if name == "iq4_xs":
            lib.iq4_xs_quant_x.argtypes = [_p, _i, _i, _p, _p]

    @property
    def isa(self) -> str:
        return getattr(self.lib, f"{self.name}_isa")().decode()

    def gemm(self, W: np.ndarray, x: np.ndarray, *, nthreads: int = 2, mode: int = 0) -> np.ndarray:
        W, x = np.ascontiguousarray(W).view(np.uint8), np.ascontiguousarray(x, dtype=np.float32)
        N, K = W.shape[0], x.shape[1]
        assert W.shape[1] == K * BYTES[self.name]
        y = np.full((x.shape[0], N), np.nan, dtype=np.float32)
        assert self._gemm(W.ctypes.data, N, K, x.ctypes.data, x.shape[0], y.ctypes.data, nthreads, mode) == 0
        return y

    def dequant(self, W: np.ndarray, K: int) -> np.ndarray:
        W = np.ascontiguousarray(W).view(np.uint8)
        out = np.empty((W.shape[0], K), dtype=np.float32)
        getattr(self.lib, f"{self.name}_dequant")(W.ctypes.data, W.shape[0], K, out.ctypes.data)
        return out

    def quant_x(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.ascontiguousarray(x, dtype=np.float32)
        a, dx = np.empty(x.shape, dtype=np.int8), np.empty((x.shape[0], x.shape[1] // 32), dtype=np.float32)
        self.lib.iq4_xs_quant_x(x.ctypes.data, x.shape[0], x.shape[1], a.ctypes.data, dx.ctypes.data)
        return a, dx


_kernels: dict[tuple[str, str], Kernel] = {}


def kernel(name: str, isa: str) -> Kernel:
    if (name, isa) not in _kernels:
        _kernels[(name, isa)] = Kernel(name, build.load(name, isa))
    return _kernels[(name, isa)]


@pytest.fixture(scope="module")
def avxvnni_iq4_xs(tmp_path_factory) -> Kernel:
    """IQ4_XS built for AVX2 + AVX-VNNI (build.py's isas do not pick that path on an AVX-512 CPU)."""
    cxx = build.compiler()
    if not AVXVNNI or cxx is None:
        pytest.skip("CPU without AVX-VNNI or no compiler")
    so = tmp_path_factory.mktemp("avxvnni-iq4xs") / "libiq4_xs.so"
    cmd = [cxx, *build.COMMON_FLAGS, "-march=x86-64-v3", "-mf16c", "-mavxvnni", "-I", str(build.HERE), "-o", str(so),
           str(build.HERE / "iq4_xs.cpp")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"compiler without -mavxvnni: {done.stderr[-300:]}")
    import torch  # noqa: F401  (same OpenMP runtime order as build.load)

    return Kernel("iq4_xs", ctypes.CDLL(str(so)))


def builds(name: str, request) -> dict[str, Kernel]:
    out = {isa: kernel(name, isa) for isa in ISAS}
    if name == "iq4_xs" and AVXVNNI:
        out["avx2+avxvnni"] = request.getfixturevalue("avxvnni_iq4_xs")
    return out


def fp16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(*values.shape, 2)


def iq4_xs_blocks(N: int, K: int, seed: int = 0) -> np.ndarray:
    """Random block_iq4_xs rows: random codes and 6-bit scales; fp16 d some zero, subnormal, negative, large; the
    first superblock's codes all 15 (v = 113), the last's all 0 (v = -127)."""
    rng = np.random.default_rng(seed)
    nb = K // 256
    raw = rng.integers(0, 256, size=(N, nb, 136), dtype=np.uint8)
    d = rng.standard_normal((N, nb)) * 0.002
    d.flat[::37] = 0.0
    d.flat[5::41] = 3e-6  # fp16 subnormal
    d.flat[7::43] = -0.25
    raw[:, :, 0:2] = fp16_bytes(d)
    raw[0, 0, 8:] = 0xFF
    raw[-1, -1, 8:] = 0x00
    return raw.reshape(N, nb * 136)


def half_weights(name: str, N: int, K: int, seed: int = 0, specials: bool = True) -> np.ndarray:
    """Random F16 / BF16 weights as their bytes [N, 2K]: normal values, some zeros of both signs, subnormals and,
    with ``specials`` (and N >= 4), the largest finite values and infinities."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((N, K)) * 0.3).astype(np.float32)
    w.flat[::29] = 0.0
    w.flat[3::31] = -0.0
    if name == "f16":
        bits = w.astype(np.float16).view(np.uint16)
        bits.flat[5::37] = rng.integers(1, 0x400, bits.flat[5::37].size)  # subnormals
        if specials and N >= 4:  # (the infinities in rows 1 and N - 1)
            bits.flat[11::53], bits.flat[13::59] = 0x7BFF, 0xFBFF  # +-65504
            bits[1, 3], bits[-1, ::7] = 0x7C00, 0xFC00  # infinities in two weight rows
    else:
        bits = (w.view(np.uint32) >> 16).astype(np.uint16)
        bits.flat[5::37] = rng.integers(1, 0x80, bits.flat[5::37].size)  # subnormals
        if specials and N >= 4:  # (the infinities in rows 1 and N - 1)
            bits.flat[11::53], bits.flat[13::59] = 0x7F7F, 0xFF7F  # +-3.39e38
            bits[1, 3], bits[-1, ::7] = 0xFF80, 0x7F80
    return np.ascontiguousarray(bits).view(np.uint8).reshape(N, 2 * K)


def weights(name: str, N: int, K: int, seed: int = 0) -> np.ndarray:
    return iq4_xs_blocks(N, K, seed) if name == "iq4_xs" else half_weights(name, N, K, seed)


def small_x(k: int, K: int, seed: int) -> np.ndarray:
    """Activations that keep sums over the largest weights finite (|x| < 1e-30 where the weights reach 3.4e38)."""
    return random_x(k, K, seed) * np.float32(1e-32)


SHAPES = {  # (N, K): one prompt panel of 16 columns, one column, partial panels and tiles
    "iq4_xs": [(67, 256 * 3), (33, 256), (20, 256 * 5), (1, 256 * 2), (16, 256)],
    "f16": [(67, 16 * 29), (33, 16), (20, 16 * 70), (1, 16 * 3), (16, 32)],
}
SHAPES["bf16"] = SHAPES["f16"]
NAMES = ["iq4_xs", "f16", "bf16"]


# ---------------------------------------------------------------- decoding

@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", NAMES)
def test_dequant_equals_gguf(name, isa):
    K = 256 * 3
    W = weights(name, 40, K, seed=3)
    if name == "f16":  # NaN payloads too: the decoder keeps them, as numpy does
        W.view(np.uint16).flat[19::401] = 0x7D01
    want = dequantize(W.view(np.float16) if name == "f16" else W, QTYPE[name])
    assert want.shape == (40, K) and want.dtype == np.float32
    assert_bitwise(kernel(name, isa).dequant(W, K), want, f"{name} dequant ({isa})")


@pytest.mark.parametrize("isa", ISAS)
def test_iq4_xs_activations_are_the_shared_quantizer(isa):
    x = random_x(5, 256 * 2, seed=4)
    x[-1, 33:38] = [0.5, -0.5, 2.5, -3.5, 126.5]  # dx = 1 in that block: exact ties (roundf: away from zero)
    a, dx = kernel("iq4_xs", isa).quant_x(x)
    a2, dx2 = np_quant_x(x)
    assert_bitwise(dx, dx2, "dx")
    assert np.array_equal(a, a2)


# ---------------------------------------------------------------- paths and builds agree

@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", NAMES)
def test_fast_path_equals_reference(name, isa):
    kern = kernel(name, isa)
    if isa != "native":
        assert kern.isa == isa
    elif {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi"} <= FLAGS:
        assert kern.isa == ("avx512-vnni" if name == "iq4_xs" else "avx512")
    for s, (N, K) in enumerate(SHAPES[name]):
        W = weights(name, N, K, seed=10 + s)
        for k in (1, 3, 16, 17):
            x = random_x(k, K, seed=20 + k) if name == "iq4_xs" else small_x(k, K, 20 + k)
            ref = kern.gemm(W, x, mode=REFERENCE)
            assert np.isfinite(ref).mean() >= 0.8
            for mode in (0, PROMPT):
                assert_bitwise(kern.gemm(W, x, mode=mode), ref if mode == 0 or name != "iq4_xs" else
                               kern.gemm(W, x, mode=PROMPT | REFERENCE), f"{name} {isa} N={N} K={K} k={k} {mode}")


@pytest.mark.parametrize("name", NAMES)
def test_isa_builds_equal(name, request):
    kerns = builds(name, request)
    for s, (N, K) in enumerate(SHAPES[name]):
        W = weights(name, N, K, seed=30 + s)
        x = random_x(19, K, seed=31 + s) if name == "iq4_xs" else small_x(19, K, 31 + s)
        for mode in (0, PROMPT):
            want = kerns["native"].gemm(W, x, mode=mode)
            for isa, kern in kerns.items():
                assert_bitwise(kern.gemm(W, x, mode=mode), want, f"{name} {isa} vs native, N={N} K={K} mode {mode}")
                assert_bitwise(kern.gemm(W, x, mode=mode | REFERENCE), want, f"{name} {isa} reference, mode {mode}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", ["f16", "bf16"])
def test_half_is_f32_on_the_decoded_weights(name, isa):
    """f32.cpp's product of gguf's de-quantized weights, bit for bit (inf and the largest values included)."""
    f32 = kernel("f32", isa)
    for s, (N, K) in enumerate(SHAPES[name]):
        W = half_weights(name, N, K, seed=70 + s)
        decoded = dequantize(W.view(np.float16) if name == "f16" else W, QTYPE[name])
        for j, x in enumerate((small_x(9, K, 71 + s), random_x(9, K, 72 + s))):  # BF16's second x: overflows
            want = f32.gemm(decoded, x)
            assert (N < 4 or np.isinf(want).any()) and (j or np.isfinite(want).mean() > 0.5)
            for mode in (0, REFERENCE, PROMPT):
                assert_bitwise(kernel(name, isa).gemm(W, x, mode=mode), want, f"{name} {isa} N={N} K={K} {mode}")


# ---------------------------------------------------------------- invariance

@pytest.mark.parametrize("mode", [0, PROMPT])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", NAMES)
def test_rows_batch_and_thread_invariant(name, isa, mode):
    kern = kernel(name, isa)
    N, K = 45, (256 * 3 if name == "iq4_xs" else 16 * 37)
    W = weights(name, N, K, seed=7)
    x = random_x(24, K, seed=8) if name == "iq4_xs" else small_x(24, K, 8)
    assert_rows_invariant(kern, W, x, f"{name} {isa} mode {mode}", mode=mode)
    alone = kern.gemm(W, x, nthreads=1, mode=mode)
    assert_bitwise(kern.gemm(W[:7], x, nthreads=3, mode=mode), alone[:, :7], "fewer columns than tiles x threads")


# ---------------------------------------------------------------- IQ4_XS accuracy and bounds

@pytest.mark.parametrize("isa", ISAS)
def test_iq4_xs_accuracy_vs_float64(isa):
    """Per element the kernels round S = dl * dx and each fma once per 32 weights (scoring: per lane, then 4 levels
    of lane sums; dl = d * (ls - 32) is exact): at most (2 nb + 8) 2^-24 of the terms' size, nb = K / 32."""
    kern = kernel("iq4_xs", isa)
    for s, (N, K) in enumerate(SHAPES["iq4_xs"]):
        W = iq4_xs_blocks(N, K, seed=40 + s)
        x = random_x(6, K, seed=41 + s)
        a, dx = kern.quant_x(x)
        xq = (a.astype(np.float64).reshape(6, -1, 32) * dx.astype(np.float64)[..., None]).reshape(x.shape)
        w = dequantize(W, T.IQ4_XS).astype(np.float64)
        ref, scale = xq @ w.T, float((np.abs(xq) @ np.abs(w).T).max())
        for mode in (0, PROMPT):
            y = kern.gemm(W, x, mode=mode).astype(np.float64)
            assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 1e-5, (isa, N, K, mode)
            assert np.abs(y - ref).max() <= (2 * K // 32 + 8) * 2.0 ** -24 * scale, (isa, N, K, mode)


def test_iq4_xs_extreme_products():
    """Every code at an end of the table (v = -127, 113, and both) and every sub-block scale at an end (ls - 32 =
    -32, 31) against activations of +-127: the integer dots (dpbusd with the bias, AVX2's int16 pairs) at their
    bounds, every build and mode, = the reference and within float32 rounding of the exact sum."""
    K = 256 * 2
    x = np.full((9, K), 1.0, dtype=np.float32)
    x[1::2] = -1.0
    for code in (0x00, 0xFF, 0x0F):
        for sh, sl in ((0x0000, 0x00), (0xFFFF, 0xFF), (0x5555, 0x0F)):
            W = iq4_xs_blocks(20, K, seed=3).reshape(20, K // 256, 136)
            W[:, :, 0:2] = fp16_bytes(np.full((20, K // 256), 0.5))
            W[:, :, 2:4] = np.frombuffer(np.uint16(sh).tobytes(), dtype=np.uint8)
            W[:, :, 4:8], W[:, :, 8:] = sl, code
            W = W.reshape(20, -1)
            w = dequantize(W, T.IQ4_XS).astype(np.float64)  # a = +-127, dx = 1/127 (float32)
            want = w.sum(axis=1) * 127 * np.float64(np.float32(1) / np.float32(127))
            scale = np.abs(w).sum(axis=1).max()
            for isa in ISAS:
                for mode in (0, PROMPT):
                    y = kernel("iq4_xs", isa).gemm(W, x, mode=mode)
                    assert_bitwise(y, kernel("iq4_xs", "scalar").gemm(W, x, mode=mode | REFERENCE), f"{isa} {mode}")
                    err = max(np.abs(y[0] - want).max(), np.abs(y[1] + want).max())
                    assert err <= 1e-6 * scale, (code, sh, isa, mode, err, scale)


@pytest.mark.parametrize("name,K", [("iq4_xs", 128), ("iq4_xs", 384), ("f16", 24), ("bf16", 8)])
def test_bad_K(name, K):
    lib = kernel(name, "native").lib
    y, x, W = np.zeros((1, 4), dtype=np.float32), np.zeros((1, K), dtype=np.float32), np.zeros((4, 2 * K), np.uint8)
    assert getattr(lib, f"{name}_gemm")(W.ctypes.data, 4, K, x.ctypes.data, 1, y.ctypes.data, 1, 0) == -1
