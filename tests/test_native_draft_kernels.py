"""The Q8_0 / Q5_0 CPU kernels (specdec/native/q8_0.cpp, q5_0.cpp): exact decoding, bitwise agreement of every
compiled path with the scalar reference, batch and thread invariance, accuracy against float64.

Every build (isa) this CPU can run is checked; an AVX2 + AVX-VNNI build is compiled on the side where the CPU has
AVX-VNNI (build.py's isas never select that path on an AVX-512 machine). Real tensors come from the draft GGUF when
it is in the cache (skipped otherwise).
"""

from __future__ import annotations

import ctypes
import functools
import pathlib
import subprocess

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from specdec.cache import cache_dir  # noqa: E402
from specdec.native import build  # noqa: E402

FORMATS = {"q8_0": (GGMLQuantizationType.Q8_0, 34), "q5_0": (GGMLQuantizationType.Q5_0, 22)}
GGUF_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def _cpu_flags() -> set[str]:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


FLAGS = _cpu_flags()
ISAS = ["native", "scalar"] + (["avx2"] if {"avx2", "fma", "f16c"} <= FLAGS else [])
AVXVNNI = {"avx2", "fma", "f16c", "avx_vnni"} <= FLAGS


def _declare(lib: ctypes.CDLL, name: str) -> ctypes.CDLL:
    p, i = ctypes.c_void_p, ctypes.c_int
    getattr(lib, f"{name}_gemm").argtypes = [p, i, i, p, i, p, i, i]
    getattr(lib, f"{name}_gemm").restype = ctypes.c_int
    getattr(lib, f"{name}_dequant").argtypes = [p, ctypes.c_int, ctypes.c_int, p]
    getattr(lib, f"{name}_dequant").restype = None
    getattr(lib, f"{name}_quant_x").argtypes = [p, ctypes.c_int, ctypes.c_int, p, p]
    getattr(lib, f"{name}_quant_x").restype = None
    getattr(lib, f"{name}_isa").restype = ctypes.c_char_p
    return lib


class Kernel:
    def __init__(self, name: str, lib: ctypes.CDLL):
        self.name, self.lib = name, _declare(lib, name)
        self.bb = FORMATS[name][1]

    @property
    def isa(self) -> str:
        return getattr(self.lib, f"{self.name}_isa")().decode()

    def gemm(self, W: np.ndarray, x: np.ndarray, *, nthreads: int = 2, mode: int = 0) -> np.ndarray:
        W = np.ascontiguousarray(W, dtype=np.uint8)
        x = np.ascontiguousarray(x, dtype=np.float32)
        N, K = W.shape[0], x.shape[1]
        assert W.shape[1] == K // 32 * self.bb
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
        a = np.empty((k, K), dtype=np.int8)
        dx = np.empty((k, K // 32), dtype=np.float32)
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
    out = {}
    d = tmp_path_factory.mktemp("avxvnni")
    for name in FORMATS:
        so = d / f"lib{name}.so"
        cmd = [cxx, *build.COMMON_FLAGS, "-march=x86-64-v3", "-mf16c", "-mavxvnni", "-o", str(so),
               str(build.HERE / f"{name}.cpp")]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"compiler without -mavxvnni: {done.stderr[-300:]}")
        import torch  # noqa: F401  (same OpenMP runtime order as build.load)

        out[name] = Kernel(name, ctypes.CDLL(str(so)))
    return out


def random_blocks(name: str, N: int, K: int, seed: int = 0) -> np.ndarray:
    """Random raw blocks with finite, modest fp16 scales (some zero, some subnormal)."""
    rng = np.random.default_rng(seed)
    bb = FORMATS[name][1]
    nb = K // 32
    raw = rng.integers(0, 256, size=(N, nb, bb), dtype=np.uint8)
    d = (rng.standard_normal((N, nb)) * 0.02).astype(np.float16)
    d.flat[::37] = np.float16(0.0)
    d.flat[5::41] = np.float16(3e-6)  # fp16 subnormal
    d.flat[7::43] = np.float16(-1.5)
    raw[:, :, 0:2] = d.view(np.uint8).reshape(N, nb, 2)
    if name == "q8_0":
        raw[0, 0, 2:] = 0x80  # all -128
        raw[-1, 0, 2:] = 0x7F
    else:
        raw[0, 0, 2:] = 0xFF  # all codes 31
        raw[-1, 0, 2:] = 0x00  # all codes 0
    return raw.reshape(N, nb * bb)


def random_x(k: int, K: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((k, K)) * rng.uniform(0.1, 10, size=(k, 1))).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero activation block
    if K >= 64:
        x[-1, 32:64] = np.float32(127.0) * np.sign(x[-1, 32:64])  # ties / max values
    return x


@functools.lru_cache(maxsize=1)
def _tensors() -> dict:
    """The draft GGUF's tensors by name (the reader parses once: ~8 s for the tokenizer metadata)."""
    from gguf import GGUFReader

    return {t.name: t for t in GGUFReader(cache_dir() / GGUF_NAME).tensors}


def _need_gguf() -> None:
    if not (cache_dir() / GGUF_NAME).is_file():
        pytest.skip(f"{GGUF_NAME} not in the cache")


def real_tensor(name: str, tensor: str, rows: int | None = None):
    _need_gguf()
    for t in _tensors().values():
        if t.name == tensor:
            assert t.tensor_type == FORMATS[name][0], (tensor, t.tensor_type)
            K = int(t.shape[0])
            data = np.asarray(t.data)
            if rows is not None:
                idx = np.linspace(0, data.shape[0] - 1, rows).astype(np.int64)
                data = data[idx]
            return np.ascontiguousarray(data), K
    pytest.skip(f"no tensor {tensor}")


def first_of_type(name: str, pattern: str) -> str:
    _need_gguf()
    for t in _tensors().values():
        if pattern in t.name and t.tensor_type == FORMATS[name][0]:
            return t.name
    pytest.skip(f"no {pattern} tensor of type {name}")


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_bitwise(a: np.ndarray, b: np.ndarray, what: str) -> None:
    bad = np.flatnonzero(bits(a) != bits(b))
    assert bad.size == 0, (f"{what}: {bad.size} of {a.size} differ, first at {bad[:5]}: "
                           f"{a.flat[bad[:3]]} vs {b.flat[bad[:3]]}")


def assert_rows_invariant(kern, W: np.ndarray, x: np.ndarray, label: str, mode: int = 0) -> None:
    """Each of x's rows (24 of them) bit for bit the same alone (1 thread) as inside blocks of 2..20 at three
    positions (2 threads) and in one call of all rows on 1, 2 and 3 threads."""
    n = len(x)
    alone = np.concatenate([kern.gemm(W, x[i:i + 1], nthreads=1, mode=mode) for i in range(n)])
    for k in range(2, 21):
        for s in sorted({0, n - k, k % 5}):
            y = kern.gemm(W, x[s:s + k], nthreads=2, mode=mode)
            assert_bitwise(y, alone[s:s + k], f"{label} rows {s}..{s + k - 1} in a block of {k}")
    for threads in (1, 2, 3):
        assert_bitwise(kern.gemm(W, x, nthreads=threads, mode=mode), alone, f"{label}: {threads} threads")


# ---------------------------------------------------------------- decoding

@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_dequant_synthetic(name, isa):
    K = 32 * 7
    W = random_blocks(name, 64, K, seed=3)
    got = kernel(name, isa).dequant(W, K)
    want = dequantize(W, FORMATS[name][0])
    assert want.shape == (64, K) and want.dtype == np.float32
    assert_bitwise(got, want, f"{name} dequant ({isa})")


@pytest.mark.parametrize("name,tensor", [("q5_0", "blk.0.ffn_up.weight"), ("q5_0", "token_embd.weight"),
                                         ("q8_0", "blk.0.attn_v.weight"), ("q8_0", "output.weight")])
def test_dequant_real(name, tensor):
    W, K = real_tensor(name, tensor, rows=512)
    assert_bitwise(kernel(name, "native").dequant(W, K), dequantize(W, FORMATS[name][0]), f"{name} {tensor}")


# ---------------------------------------------------------------- activations

def np_quant_x(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's quantize_row_q8_0_ref in numpy (dx kept as float32; roundf = half away from zero)."""
    xb = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(axis=-1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (xb * idv[..., None]).astype(np.float32)
    t = np.trunc(v)
    q = t + np.where(np.abs(v - t) >= np.float32(0.5), np.sign(v), np.float32(0))  # v - t is exact
    return np.clip(q, -127, 127).astype(np.int8).reshape(x.shape), d


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_quant_x_matches_ggml(name, isa):
    x = random_x(5, 32 * 9, seed=4)
    x[1, 5] = np.float32(0.5) * (np.abs(x[1, :32]).max() / np.float32(127))  # near a tie
    x[-1, 32:64] = 127.0  # dx = 1, id = 1: exact ties below (roundf: away from zero)
    x[-1, 33:38] = [0.5, -0.5, 2.5, -3.5, 126.5]
    a, dx = kernel(name, isa).quant_x(x)
    a2, dx2 = np_quant_x(x)
    assert_bitwise(dx, dx2, "dx")
    assert np.array_equal(a, a2)
    assert list(a[-1, 33:38]) == [1, -1, 3, -4, 127]


# ---------------------------------------------------------------- paths agree

SHAPES = [(67, 32 * 28), (45, 32 * 7), (33, 32 * 1), (20, 32 * 13)]  # K/32 = 28, 7 (tail 3), 1, 13 (tail 1)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
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


@pytest.mark.parametrize("name", FORMATS)
def test_isa_builds_equal(name, avxvnni_kernels):
    assert avxvnni_kernels[name].isa == "avx2"
    builds = {isa: kernel(name, isa) for isa in ISAS} | {"avx2+avxvnni": avxvnni_kernels[name]}
    for s, (N, K) in enumerate(SHAPES):
        W = random_blocks(name, N, K, seed=30 + s)
        x = random_x(19, K, seed=31 + s)
        ys = {isa: kern.gemm(W, x) for isa, kern in builds.items()}
        ref = ys.pop("native")
        for isa, y in ys.items():
            assert_bitwise(y, ref, f"{name} {isa} vs native, N={N} K={K}")
        assert_bitwise(kernel(name, "native").gemm(W, x, mode=1), ref, "reference")


@pytest.mark.parametrize("isa", ["native", "avx2"])
@pytest.mark.parametrize("name", FORMATS)
def test_isa_builds_equal_real(name, isa):
    if isa not in ISAS:
        pytest.skip("CPU without AVX2")
    W, K = real_tensor(name, "blk.0.ffn_up.weight" if name == "q5_0" else "output.weight", rows=384)
    x = random_x(9, K, seed=5)
    y = kernel(name, isa).gemm(W, x)
    assert_bitwise(y, kernel(name, "scalar").gemm(W, x), f"{name} {isa} vs scalar (real)")
    assert_bitwise(y, kernel(name, isa).gemm(W, x, mode=1), f"{name} {isa} vs reference (real)")


# ---------------------------------------------------------------- invariance

@pytest.mark.parametrize("isa", ["native", "avx2"])
@pytest.mark.parametrize("name", FORMATS)
def test_rows_batch_and_thread_invariant(name, isa):
    if isa not in ISAS:
        pytest.skip("CPU without AVX2")
    kern = kernel(name, isa)
    N, K = 96, 32 * 29
    W = random_blocks(name, N, K, seed=7)
    x = random_x(24, K, seed=8)
    assert_rows_invariant(kern, W, x, f"{name} {isa}")


@pytest.mark.parametrize("name", FORMATS)
def test_rows_invariant_real(name):
    tensor = first_of_type(name, "attn_v.weight")
    W, K = real_tensor(name, tensor)
    kern = kernel(name, "native")
    x = random_x(20, K, seed=9)
    alone = np.concatenate([kern.gemm(W, x[i:i + 1], nthreads=1) for i in range(20)])
    for k in (2, 5, 8, 16, 20):
        assert_bitwise(kern.gemm(W, x[20 - k:], nthreads=2), alone[20 - k:], f"{name} {tensor} k={k}")


# ---------------------------------------------------------------- accuracy

def float64_reference(kern: Kernel, W: np.ndarray, K: int, x: np.ndarray) -> np.ndarray:
    a, dx = kern.quant_x(x)
    xq = (a.astype(np.float64).reshape(x.shape[0], -1, 32) * dx.astype(np.float64)[..., None]).reshape(x.shape)
    return xq @ dequantize(W, FORMATS[kern.name][0]).astype(np.float64).T


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_accuracy_vs_float64(name, isa):
    kern = kernel(name, isa)
    for s, (N, K) in enumerate(SHAPES):
        W = random_blocks(name, N, K, seed=40 + s)
        x = random_x(6, K, seed=41 + s)
        ref = float64_reference(kern, W, K, x)
        y = kern.gemm(W, x).astype(np.float64)
        err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
        assert err < 1e-5, (name, isa, N, K, err)
        assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max() + 1e-30


@pytest.mark.parametrize("name,tensor", [("q5_0", "blk.0.ffn_up.weight"), ("q8_0", "output.weight")])
def test_accuracy_real(name, tensor):
    W, K = real_tensor(name, tensor, rows=1024)
    kern = kernel(name, "native")
    x = random_x(4, K, seed=11)
    ref = float64_reference(kern, W, K, x)
    err = np.linalg.norm(kern.gemm(W, x) - ref) / np.linalg.norm(ref)
    assert err < 1e-5, err


@pytest.mark.parametrize("name", FORMATS)
def test_bad_K(name):
    kern = kernel(name, "native")
    y = np.zeros((1, 4), dtype=np.float32)
    x = np.zeros((1, 48), dtype=np.float32)
    W = np.zeros((4, 64), dtype=np.uint8)
    assert getattr(kern.lib, f"{name}_gemm")(W.ctypes.data, 4, 48, x.ctypes.data, 1, y.ctypes.data, 1, 0) == -1
