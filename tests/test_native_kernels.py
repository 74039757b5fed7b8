"""The Q4_K / Q6_K CPU kernels of specdec.native under every instruction set this CPU runs.

For each format and each ``isa`` of ``specdec.native.build`` this CPU can run (native, avx2, scalar):
decoding == gguf.quants.dequantize bit for bit; mode 0 (fast path) == mode 1 (scalar reference) bitwise;
the isa builds equal each other bitwise (and an AVX-VNNI variant of the AVX2 path, where the CPU has it);
every row alone == inside blocks of 2..20 rows at several positions; 1 thread == 2 threads; accuracy
against a float64 product with the kernel's own int8 activations. Synthetic blocks always, rows of the
default GGUF when it is in the cache.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import platform
import subprocess

import gguf
import numpy as np
import pytest

from specdec.cache import cache_dir
from specdec.native import build

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="the kernels are x86-64 code")

GGUF_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
FORMATS = {  # name -> (ggml type, bytes per 256-weight block, preferred real tensors)
    "q4k": (gguf.GGMLQuantizationType.Q4_K, 144, ("blk.0.ffn_up.weight", "blk.0.attn_q.weight")),
    "q6k": (gguf.GGMLQuantizationType.Q6_K, 210, ("blk.0.attn_v.weight", "output.weight", "blk.0.ffn_down.weight")),
}
AVX512_FLAGS = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512vbmi", "f16c", "fma"}
AVX2_FLAGS = {"avx2", "fma", "f16c"}


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


FLAGS = cpu_flags()
ISAS = ["native", "scalar"] + (["avx2"] if AVX2_FLAGS <= FLAGS else [])
EXPECTED_PATH = {"native": "avx512-vnni" if AVX512_FLAGS <= FLAGS else "avx2" if AVX2_FLAGS <= FLAGS else "scalar",
                 "avx2": "avx2", "scalar": "scalar"}
P = ctypes.c_void_p


def ptr(a: np.ndarray) -> ctypes.c_void_p:
    return a.ctypes.data_as(P)


class Kernel:
    """ctypes view of one compiled kernel library (q4k or q6k)."""

    def __init__(self, name: str, lib: ctypes.CDLL):
        self.name, self.lib = name, lib
        self.bb = FORMATS[name][1]
        f = getattr(lib, f"{name}_gemm")
        f.argtypes = [P, ctypes.c_int, ctypes.c_int, P, ctypes.c_int, P, ctypes.c_int, ctypes.c_int]
        f.restype = ctypes.c_int
        self._gemm = f
        self._quant = getattr(lib, f"{name}_quant_x")
        self._quant.argtypes = [P, ctypes.c_int, ctypes.c_int, P, P]
        self._quant.restype = None
        self._deq = getattr(lib, f"{name}_dequant")
        self._deq.argtypes = [P, ctypes.c_int, ctypes.c_int, P]
        self._deq.restype = None
        self._isa = getattr(lib, f"{name}_isa")
        self._isa.restype = ctypes.c_char_p

    def isa(self) -> str:
        return self._isa().decode()

    def gemm(self, W: np.ndarray, K: int, x: np.ndarray, nthreads: int = 2, mode: int = 0) -> np.ndarray:
        W = np.ascontiguousarray(W, dtype=np.uint8)
        x = np.ascontiguousarray(x, dtype=np.float32)
        k = x.shape[0]
        N = W.size // (K // 256 * self.bb)
        assert W.size == N * (K // 256) * self.bb and x.shape == (k, K)
        y = np.full((k, N), np.nan, np.float32)
        assert self._gemm(ptr(W), N, K, ptr(x), k, ptr(y), nthreads, mode) == 0
        return y

    def quant_x(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.ascontiguousarray(x, dtype=np.float32)
        k, K = x.shape
        a = np.zeros((k, K), np.int8)
        dx = np.zeros((k, K // 256), np.float32)
        self._quant(ptr(x), k, K, ptr(a), ptr(dx))
        return a, dx

    def dequant(self, W: np.ndarray, K: int) -> np.ndarray:
        W = np.ascontiguousarray(W, dtype=np.uint8)
        N = W.size // (K // 256 * self.bb)
        out = np.full((N, K), np.nan, np.float32)
        self._deq(ptr(W), N, K, ptr(out))
        return out


@pytest.fixture(scope="module")
def kernels() -> dict[tuple[str, str], Kernel]:
    if build.compiler() is None:
        pytest.skip("no C++ compiler")
    jobs = [(name, isa) for name in FORMATS for isa in ISAS]
    with concurrent.futures.ThreadPoolExecutor(2) as ex:  # compile in parallel (cached after the first run)
        list(ex.map(lambda j: build.build(*j), jobs))
    return {(name, isa): Kernel(name, build.load(name, isa)) for name, isa in jobs}


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def fp16_bytes(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values.astype(np.float16)).view(np.uint8).reshape(-1, 2)


def synthetic(name: str, N: int, K: int, seed: int = 0) -> np.ndarray:
    """Random block bytes with finite, modest fp16 scales (some negative, some subnormal)."""
    rng = np.random.default_rng(seed)
    bb = FORMATS[name][1]
    nblk = N * K // 256
    blocks = rng.integers(0, 256, size=(nblk, bb), dtype=np.uint8)

    def scales() -> np.ndarray:
        v = rng.uniform(1e-3, 5e-2, nblk) * rng.choice([-1.0, 1.0], nblk)
        v[rng.random(nblk) < 0.1] = rng.uniform(-6e-5, 6e-5, 1)[0]  # fp16 subnormals
        return fp16_bytes(v)

    if name == "q4k":
        blocks[:, 0:2] = scales()
        blocks[:, 2:4] = scales()
    else:
        blocks[:, 208:210] = scales()
    return blocks.reshape(-1)


def activations(k: int, K: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((k, K)).astype(np.float32) * rng.uniform(0.1, 3.0, (k, 1)).astype(np.float32)
    x[0, :256] = 0.0  # an all-zero block (amax == 0)
    if k > 2:
        x[2, 5] = 40.0  # an outlier
    return x


@pytest.fixture(scope="module")
def real() -> dict[str, tuple[str, np.ndarray, int]]:
    """Per format: (tensor name, raw bytes of some rows, K) from the default GGUF, if cached."""
    path = cache_dir() / GGUF_NAME
    if not path.is_file():
        return {}
    reader = gguf.GGUFReader(path)
    out = {}
    for name, (qtype, bb, preferred) in FORMATS.items():
        cands = [t for t in reader.tensors if t.tensor_type == qtype and int(t.shape[0]) % 256 == 0]
        cands.sort(key=lambda t: (t.name not in preferred, preferred.index(t.name) if t.name in preferred else 0))
        if not cands:
            continue
        t = cands[0]
        K, N = int(t.shape[0]), int(t.shape[1])
        raw = np.asarray(t.data).reshape(N, -1)
        assert raw.shape[1] == K // 256 * bb
        rows = np.r_[0:96, N // 2:N // 2 + 64, N - 32:N]  # 192 rows: start, middle, end
        out[name] = (t.name, np.ascontiguousarray(raw[rows]).reshape(-1), K)
    return out


def real_or_skip(real, name):
    if name not in real:
        pytest.skip(f"{GGUF_NAME} not in {cache_dir()} (or no {name} tensor)")
    return real[name]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_isa_path(kernels, name, isa):
    assert kernels[name, isa].isa() == EXPECTED_PATH[isa]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_decode_synthetic(kernels, name, isa):
    K = 1024
    W = synthetic(name, 48, K, seed=3)
    got = kernels[name, isa].dequant(W, K)
    want = gguf.quants.dequantize(W.reshape(48, -1), FORMATS[name][0]).astype(np.float32)
    assert np.count_nonzero(want) > 0.9 * want.size and np.isfinite(want).all()
    assert same_bits(got, want)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_decode_real(kernels, real, name, isa):
    tname, W, K = real_or_skip(real, name)
    got = kernels[name, isa].dequant(W, K)
    want = gguf.quants.dequantize(W.reshape(got.shape[0], -1), FORMATS[name][0]).astype(np.float32)
    assert np.count_nonzero(want) > 0.5 * want.size, tname
    assert same_bits(got, want), tname


def _cases(real, name):
    cases = [("synthetic", synthetic(name, 40, 768, seed=5), 768)]
    if name in real:
        tname, W, K = real[name]
        cases.append((tname, W, K))
    return cases


@pytest.mark.parametrize("name", FORMATS)
def test_modes_and_isas_bitwise(kernels, real, name):
    """mode 0 == mode 1 in every build, and all builds give the same bits, for k = 1, 3, 16 and 19."""
    for label, W, K in _cases(real, name):
        for k in (1, 3, 16, 19):
            x = activations(k, K, seed=k)
            ref = kernels[name, "scalar"].gemm(W, K, x, mode=1)
            assert np.isfinite(ref).all() and np.count_nonzero(ref) > 0.9 * ref.size, (label, k)
            for isa in ISAS:
                for mode in (0, 1):
                    assert same_bits(kernels[name, isa].gemm(W, K, x, mode=mode), ref), (label, k, isa, mode)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_batch_invariance(kernels, real, name, isa):
    """Every row alone == the same row inside blocks of k = 2..20 rows (Q4_K: groups of <= 12, Q6_K: of 16), 3
    positions."""
    kern = kernels[name, isa]
    for label, W, K in _cases(real, name):
        if isa == "scalar" and label != "synthetic":
            W = W[: 48 * K // 256 * kern.bb]  # the scalar path is slow: fewer rows
        xs = activations(20, K, seed=11)
        alone = np.concatenate([kern.gemm(W, K, xs[i:i + 1]) for i in range(20)])
        assert np.count_nonzero(alone) > 0.9 * alone.size
        for k in range(2, 21):
            for p in sorted({0, (20 - k) // 2, 20 - k}):
                y = kern.gemm(W, K, xs[p:p + k])
                assert same_bits(y, alone[p:p + k]), (label, k, p)


@pytest.mark.parametrize("isa", ["native"] + (["avx2"] if "avx2" in ISAS else []))
@pytest.mark.parametrize("name", FORMATS)
def test_batch_invariance_many_groups(kernels, name, isa):
    """Rows alone == the same rows in blocks of 24, 33, 41 rows (2 to 4 groups), synthetic weights, some rows."""
    kern = kernels[name, isa]
    K = 512
    W = synthetic(name, 70, K, seed=7)  # 70 outputs: a tile of 64 and a partial one
    xs = activations(41, K, seed=13)
    for k in (24, 33, 41):
        y = kern.gemm(W, K, xs[:k])
        for r in (0, 1, k // 2, k - 1):
            assert same_bits(y[r:r + 1], kern.gemm(W, K, xs[r:r + 1])), (k, r)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_threads(kernels, real, name, isa):
    kern = kernels[name, isa]
    for label, W, K in _cases(real, name):
        for k in (5, 17):
            x = activations(k, K, seed=k + 100)
            y1 = kern.gemm(W, K, x, nthreads=1)
            y2 = kern.gemm(W, K, x, nthreads=2)
            assert np.count_nonzero(y1) > 0.9 * y1.size
            assert same_bits(y1, y2), (label, k)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_accuracy(kernels, real, name, isa):
    """Relative error vs a float64 product of the decoded weights and the kernel's own int8 activations."""
    kern = kernels[name, isa]
    for label, W, K in _cases(real, name):
        x = activations(7, K, seed=21)
        y = kern.gemm(W, K, x).astype(np.float64)
        a, dx = kern.quant_x(x)
        assert np.abs(a).max() == 127 and (dx > 0).sum() >= dx.size - 1  # one all-zero block
        w = kern.dequant(W, K).astype(np.float64)
        nb = K // 256
        xq = (a.astype(np.float64).reshape(-1, nb, 256) * dx.astype(np.float64)[:, :, None]).reshape(-1, K)
        y64 = xq @ w.T
        rel = np.linalg.norm(y - y64) / np.linalg.norm(y64)
        assert np.linalg.norm(y64) > 0 and rel < 1e-5, (label, rel)


@pytest.mark.parametrize("name", FORMATS)
def test_nonfinite_scale(kernels, name):
    """A block whose fp16 dmin (Q4_K) / d (Q6_K) is inf: every path still gives the reference's bits.

    Q4_K: all mins > 0 and x > 0, so lanes 8..15 give -inf and only lanes 0..7 (dmin*sc times XB = 0) give the
    NaN: the AVX2 path must not skip their fnmadd for such a block."""
    K = 512
    W = synthetic(name, 8, K, seed=9).reshape(8 * K // 256, -1)
    x = activations(3, K, seed=4)
    if name == "q4k":
        W[3, 2:4] = fp16_bytes(np.array([np.inf]))[0]      # row 1, block 1: dmin = inf
        W[3, 4:16] = 0x21                                    # sc, m = 33 (j < 4), 1, 2 (j >= 4): all > 0
        x = np.abs(x)
    else:
        W[3, 208:210] = fp16_bytes(np.array([-np.inf]))[0]
    W = W.reshape(-1)
    ref = kernels[name, "scalar"].gemm(W, K, x, mode=1)
    assert not np.isfinite(ref[:, 1]).any() and np.isfinite(np.delete(ref, 1, axis=1)).all()
    if name == "q4k":
        assert np.isnan(ref[:, 1]).all()
    for isa in ISAS:
        for mode in (0, 1):
            assert same_bits(kernels[name, isa].gemm(W, K, x, mode=mode), ref), (isa, mode)


@pytest.fixture(scope="module")
def vnni_kernels(tmp_path_factory) -> dict[str, Kernel]:
    """The AVX2 path with AVX-VNNI dot products (-mavxvnni), compiled here: build.py has no such isa."""
    if not ({"avx_vnni"} | AVX2_FLAGS) <= FLAGS or build.compiler() is None:
        pytest.skip("this CPU has no AVX-VNNI")
    out_dir = tmp_path_factory.mktemp("vnni")

    def compile_one(name):
        so = out_dir / f"lib{name}_vnni.so"
        cmd = [build.compiler(), *build.COMMON_FLAGS, "-march=x86-64-v3", "-mf16c", "-mavxvnni", "-o", str(so),
               str(build.HERE / f"{name}.cpp")]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"the compiler cannot build with -mavxvnni: {done.stderr[-500:]}")
        return name, Kernel(name, ctypes.CDLL(str(so)))

    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        return dict(ex.map(compile_one, FORMATS))


@pytest.mark.parametrize("name", FORMATS)
def test_avxvnni_variant(kernels, vnni_kernels, real, name):
    kern = vnni_kernels[name]
    assert kern.isa() == "avx2"
    for label, W, K in _cases(real, name):
        for k in (1, 16, 19):
            x = activations(k, K, seed=k + 7)
            ref = kernels[name, "scalar"].gemm(W, K, x, mode=1)
            assert np.count_nonzero(ref) > 0.9 * ref.size
            assert same_bits(kern.gemm(W, K, x), ref), (label, k)
