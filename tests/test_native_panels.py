"""Q4_K, Q6_K, Q2_K, Q3_K and Q5_K in panels of 16 output rows (specdec/native/q4k16.cpp, q6k16.cpp, q2k16.cpp,
q3k16.cpp, q5k16.cpp) under every isa this CPU runs.

The panels decode to gguf's float32 values bit for bit; the product equals the format's prompt-reading product of
the file's blocks (q4k.cpp / q6k.cpp / q2k.cpp / q3k.cpp / q5k.cpp mode 2 and its reference, mode 3) bit for bit in
every mode, row count and isa, AMX tiles included where the CPU has them (mode 4: never AMX); every row alone equals the
same row inside blocks of 2..40 rows at several positions; 1 thread equals 2; bad shapes are refused. And the
models' use of them: a matrix whose rows are a multiple of 16 runs on its panels (other row counts on the blocks),
the file's pages are let go, and a cut of the matrix keeps the arithmetic of its rows.
"""

from __future__ import annotations

import ctypes
import subprocess

import gguf
import numpy as np
import pytest
import test_native_kernels
import test_native_kquant_types
import torch
from test_native_kernels import EXPECTED_PATH, ISAS, activations, fp16_bytes, same_bits

from specdec.cache import cache_dir
from specdec.native import build
from specdec.native.kernels import QuantMatrix

P, INT = ctypes.c_void_p, ctypes.c_int
Q4_K = gguf.GGMLQuantizationType.Q4_K
pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler")
# name -> (ggml type, bytes per 256-weight block, preferred real tensors): the blocks' formats, and Q2_K, Q3_K and
# Q5_K (real rows from their preset files, when cached: the default GGUF has no Q2_K, Q3_K or Q5_K matrix)
FORMATS = {**test_native_kernels.FORMATS,
           "q2k": (gguf.GGMLQuantizationType.Q2_K, 84, ("blk.0.ffn_up.weight", "blk.0.attn_q.weight")),
           "q3k": (gguf.GGMLQuantizationType.Q3_K, 110, ("blk.0.attn_q.weight", "blk.0.ffn_gate.weight")),
           "q5k": (gguf.GGMLQuantizationType.Q5_K, 176, ("blk.0.ffn_up.weight", "blk.0.attn_q.weight"))}
PRESET_FILES = {"q2k": "presets/qwen2.5-coder-1.5b-instruct-q2_k.gguf",
                "q3k": "presets/qwen2.5-coder-1.5b-instruct-q3_k_m.gguf",
                "q5k": "presets/qwen2.5-coder-1.5b-instruct-q5_k_m.gguf"}
default_rows = test_native_kernels.real  # the fixture: rows of the default GGUF (when cached), per format


def synthetic(name: str, N: int, K: int, seed: int = 0) -> np.ndarray:
    """test_native_kernels.synthetic; Q2_K: random bytes with its d and dmin as there (some negative, subnormal);
    Q3_K: random bytes with its fp16 d (bytes 108..109) finite and modest (Q6_K's); Q5_K:
    test_native_kquant_types.random_blocks (codes at their top and at 0, zero, subnormal and negative d and dmin)."""
    if name == "q5k":
        return test_native_kquant_types.random_blocks("q5k", N, K, seed).reshape(-1)
    if name == "q3k":
        blocks = test_native_kernels.synthetic("q6k", N, K, seed).reshape(-1, 210)  # d at 208..209
        return np.ascontiguousarray(np.concatenate([blocks[:, :108], blocks[:, 208:210]], axis=1)).reshape(-1)
    if name != "q2k":
        return test_native_kernels.synthetic(name, N, K, seed)
    rng = np.random.default_rng(seed)
    nblk = N * K // 256
    blocks = rng.integers(0, 256, size=(nblk, 84), dtype=np.uint8)
    for off in (80, 82):
        v = rng.uniform(1e-3, 5e-2, nblk) * rng.choice([-1.0, 1.0], nblk)
        v[rng.random(nblk) < 0.1] = rng.uniform(-6e-5, 6e-5, 1)[0]  # fp16 subnormals
        blocks[:, off:off + 2] = fp16_bytes(v)
    return blocks.reshape(-1)


@pytest.fixture(scope="module")
def real_rows(default_rows) -> dict[str, tuple[str, np.ndarray, int]]:
    """Rows of the default GGUF (when cached) per format (test_native_kernels.real); Q2_K and Q3_K: of their preset
    files (when cached)."""
    out = dict(default_rows)
    for name, file in PRESET_FILES.items():
        path = cache_dir() / file
        if not path.is_file():
            continue
        qtype, bb, preferred = FORMATS[name]
        tensors = {t.name: t for t in gguf.GGUFReader(path).tensors
                   if t.tensor_type == qtype and int(t.shape[0]) % 256 == 0}
        names = [n for n in preferred if n in tensors] or sorted(tensors)
        if names:
            t = tensors[names[0]]
            K, N = int(t.shape[0]), int(t.shape[1])
            raw = np.asarray(t.data).reshape(N, -1)
            rows = np.r_[0:96, N // 2:N // 2 + 64, N - 32:N]  # 192 rows: start, middle, end
            out[name] = (t.name, np.ascontiguousarray(raw[rows]).reshape(-1), K)
    return out


class Panels:
    """ctypes view of a panel kernel (``panel``, default <name>16) and of <name> (the blocks' kernels, ``bb`` bytes a
    block, default FORMATS') built for one isa."""

    def __init__(self, name: str, isa: str, lib: ctypes.CDLL | None = None, *, panel: str | None = None,
                 bb: int | None = None) -> None:
        panel = panel or f"{name}16"
        self.name, self.bb = name, FORMATS[name][1] if bb is None else bb
        self.lib, blocks = lib or build.load(panel, isa), build.load(name, isa)
        self._gemm, self._blocks = getattr(self.lib, f"{panel}_gemm"), getattr(blocks, f"{name}_gemm")
        for f in (self._gemm, self._blocks):
            f.argtypes, f.restype = [P, INT, INT, P, INT, P, INT, INT], INT
        self._bytes, self._pack = getattr(self.lib, f"{panel}_bytes"), getattr(self.lib, f"{panel}_pack")
        self._bytes.restype, self._bytes.argtypes = ctypes.c_size_t, [INT, INT]
        self._pack.restype, self._pack.argtypes = INT, [P, INT, INT, P, INT]
        self.dequant = getattr(self.lib, f"{panel}_dequant")
        self.dequant.argtypes = [P, INT, INT, P]
        self.isa = getattr(self.lib, f"{panel}_isa")
        self.isa.restype = ctypes.c_char_p

    def pack(self, W: np.ndarray, N: int, K: int) -> np.ndarray:
        out = np.zeros(self._bytes(N, K), np.uint8)
        assert self._pack(W.ctypes.data, N, K, out.ctypes.data, 2) == 0
        return out

    def gemm(self, panels: np.ndarray, N: int, K: int, x: np.ndarray, mode: int = 0, threads: int = 2) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.full((x.shape[0], N), np.nan, np.float32)
        assert self._gemm(panels.ctypes.data, N, K, x.ctypes.data, x.shape[0], y.ctypes.data, threads, mode) == 0
        return y

    def prompt_product(self, W: np.ndarray, N: int, K: int, x: np.ndarray, mode: int) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.full((x.shape[0], N), np.nan, np.float32)
        assert self._blocks(W.ctypes.data, N, K, x.ctypes.data, x.shape[0], y.ctypes.data, 2, mode) == 0
        return y


@pytest.fixture(scope="module")
def panels() -> dict[tuple[str, str], Panels]:
    return {(name, isa): Panels(name, isa) for name in FORMATS for isa in ISAS}


@pytest.fixture(scope="module")
def vnni_panels(tmp_path_factory) -> dict[str, Panels]:
    """The AVX2 path with AVX-VNNI dot products (-mavxvnni), compiled here: build.py has no such isa."""
    if not {"avx_vnni", "avx2", "fma", "f16c"} <= test_native_kernels.FLAGS:
        pytest.skip("this CPU has no AVX-VNNI")
    out = {}
    for name in FORMATS:
        so = tmp_path_factory.mktemp("vnni") / f"lib{name}16_vnni.so"
        done = subprocess.run([build.compiler(), *build.COMMON_FLAGS, "-march=x86-64-v3", "-mf16c", "-mavxvnni",
                               "-o", str(so), str(build.HERE / f"{name}16.cpp")], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"the compiler cannot build with -mavxvnni: {done.stderr[-500:]}")
        out[name] = Panels(name, "native", ctypes.CDLL(str(so)))
    return out


@pytest.mark.parametrize("name", FORMATS)
def test_avxvnni_variant(vnni_panels, real_rows, name):
    kern = vnni_panels[name]
    assert kern.isa().decode() == "avx2"
    for label, W, N, K in cases(real_rows, name):
        packed = kern.pack(W, N, K)
        for k in (1, 5, 9, 17):
            x = activations(k, K, seed=k + 7)
            assert same_bits(kern.gemm(packed, N, K, x), kern.prompt_product(W, N, K, x, 3)), (label, k)


def test_q2k16_without_gfni(real_rows, tmp_path):
    """q2k16's AVX-512 path without GFNI (its codes by shift and mask instead of gf2p8affineqb) = the reference."""
    if EXPECTED_PATH["native"] != "avx512-vnni":
        pytest.skip("no AVX-512 VNNI build here")
    so = tmp_path / "libq2k16_nogfni.so"
    done = subprocess.run([build.compiler(), *build.COMMON_FLAGS, "-march=native", "-mno-gfni", "-o", str(so),
                           str(build.HERE / "q2k16.cpp")], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"the compiler cannot build with -mno-gfni: {done.stderr[-500:]}")
    kern = Panels("q2k", "native", ctypes.CDLL(str(so)))
    for label, W, N, K in cases(real_rows, "q2k"):
        packed = kern.pack(W, N, K)
        for k in (1, 2, 5, 9, 16, 17):
            x = activations(k, K, seed=k + 3)
            for mode in (0, 4):
                assert same_bits(kern.gemm(packed, N, K, x, mode), kern.prompt_product(W, N, K, x, 3)), (label, k)


def cases(real, name: str) -> list[tuple[str, np.ndarray, int, int]]:
    """(label, blocks, N, K): synthetic blocks (subnormal and negative scales), and real rows where cached."""
    out = [("synthetic", synthetic(name, 48, 768, seed=5), 48, 768)]
    if name in real:
        label, W, K = real[name]
        out.append((label, W, W.size // (K // 256 * FORMATS[name][1]), K))
    return out


@pytest.mark.parametrize("name", FORMATS)
def test_panels_decode_as_gguf(panels, real_rows, name):
    for label, W, N, K in cases(real_rows, name):
        expected = np.asarray(gguf.quants.dequantize(W.reshape(N, -1), FORMATS[name][0]), dtype=np.float32)
        for isa in ISAS:
            kern = panels[name, isa]
            got, packed = np.full((N, K), np.nan, np.float32), kern.pack(W, N, K)
            kern.dequant(packed.ctypes.data, N, K, got.ctypes.data)
            assert same_bits(got, expected.reshape(N, K)), (label, isa)


@pytest.mark.parametrize("name", FORMATS)
def test_the_prompt_products_bits_in_every_mode_and_isa(panels, real_rows, name):
    """Modes 0 (the fast path; AMX from 33 rows where granted), 1 (the reference), 2 (a prompt), 4 (never AMX) of
    every isa == the blocks' prompt-reading product (modes 2, 3)."""
    for label, W, N, K in cases(real_rows, name):
        for k in (1, 3, 8, 9, 17, 33, 40):
            x = activations(k, K, seed=k)
            ref = panels[name, "native"].prompt_product(W, N, K, x, 3)
            assert same_bits(panels[name, "native"].prompt_product(W, N, K, x, 2), ref), (label, k)
            for isa in ISAS:
                kern = panels[name, isa]
                packed = kern.pack(W, N, K)
                for mode in (0, 1, 2, 4):
                    assert same_bits(kern.gemm(packed, N, K, x, mode), ref), (label, k, isa, mode)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_a_row_alone_is_the_same_row_in_any_block(panels, real_rows, name, isa):
    """Every row alone == inside blocks of 2..40 rows (groups of at most 8 or 4, AMX tiles from 33) at 3 positions;
    1 thread == 2 threads."""
    kern = panels[name, isa]
    for label, W, N, K in cases(real_rows, name):
        if isa == "scalar" and label != "synthetic":
            W, N = W[: 32 * K // 256 * kern.bb], 32  # the scalar path is slow: fewer rows
        assert_rows_alone_equal_blocks(kern, W, N, K, label)


def assert_rows_alone_equal_blocks(kern, W, N: int, K: int, label: str) -> None:
    """40 activation rows, each alone on 1 thread == inside blocks of 2..40 rows on 2 threads at 3 positions."""
    packed = kern.pack(W, N, K)
    xs = activations(40, K, seed=11)
    alone = np.concatenate([kern.gemm(packed, N, K, xs[i:i + 1], threads=1) for i in range(40)])
    assert np.count_nonzero(alone) > 0.9 * alone.size
    for k in (*range(2, 18), 24, 32, 33, 40):
        for p in sorted({0, (40 - k) // 2, 40 - k}):
            assert same_bits(kern.gemm(packed, N, K, xs[p:p + k]), alone[p:p + k]), (label, k, p)


@pytest.mark.parametrize("name", FORMATS)
def test_accuracy_against_float64(panels, real_rows, name):
    """Within the int8 activations' rounding of the float64 product of the decoded weights."""
    kern = panels[name, "native"]
    for label, W, N, K in cases(real_rows, name):
        weights = np.asarray(gguf.quants.dequantize(W.reshape(N, -1), FORMATS[name][0]), dtype=np.float64)
        weights = weights.reshape(N, K)
        x = activations(6, K, seed=3)
        exact = x.astype(np.float64) @ weights.T
        got = kern.gemm(kern.pack(W, N, K), N, K, x)
        scale = np.abs(x).max(axis=1, keepdims=True) / 127 * np.abs(weights).sum(axis=1)[None, :]
        assert np.all(np.abs(got - exact) <= 0.6 * scale + 1e-4 * np.abs(exact)), label


@pytest.mark.parametrize("name", FORMATS)
def test_bad_shapes_are_refused(panels, name):
    kern = panels[name, "native"]
    W = synthetic(name, 24, 256)
    out = np.zeros(kern._bytes(32, 256), np.uint8)
    assert kern._pack(W.ctypes.data, 24, 256, out.ctypes.data, 1) == -1  # rows not a multiple of 16
    assert kern._pack(W.ctypes.data, 16, 300, out.ctypes.data, 1) == -1  # columns not a multiple of 256
    x, y = np.zeros((1, 256), np.float32), np.zeros((1, 24), np.float32)
    assert kern._gemm(out.ctypes.data, 24, 256, x.ctypes.data, 1, y.ctypes.data, 1, 0) == -1


def test_a_matrix_runs_on_panels_where_its_rows_allow(tmp_path):
    W = synthetic("q4k", 48, 512, seed=2).reshape(48, -1)
    x = torch.from_numpy(activations(5, 512, seed=4))
    on, off = QuantMatrix(W, Q4_K, 512), QuantMatrix(W, Q4_K, 512, panels=False)
    odd = QuantMatrix(np.ascontiguousarray(W[:40]), Q4_K, 512)
    assert (on.kernel, off.kernel, odd.kernel) == ("q4k16", "q4k", "q4k")
    assert on.data is not on.blocks and off.data is off.blocks
    ref = panels_reference(W, x)
    assert torch.equal(on(x), ref)  # the panels: the prompt product's bits
    assert torch.allclose(off(x), ref, rtol=1e-4, atol=1e-4)  # the blocks' scoring kernel: another summation order
    cut = on.take_rows(np.arange(16, 48))  # 32 rows: panels again, the same bits as those rows of the whole
    assert cut.kernel == "q4k16" and torch.equal(cut(x), on(x)[:, 16:48])
    # from a read-only file mapping: the same results after its pages are let go (read again from the file)
    path = tmp_path / "w.bin"
    W.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r").reshape(48, -1)
    from_file = QuantMatrix(mapped, Q4_K, 512)
    assert torch.equal(from_file(x), ref) and np.array_equal(np.asarray(from_file.blocks), W)


def panels_reference(W: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    kern = Panels("q4k", "native")
    return torch.from_numpy(kern.prompt_product(np.ascontiguousarray(W).reshape(-1), W.shape[0], x.shape[1],
                                                x.numpy(), 3))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("name", FORMATS)
def test_isa_path(panels, name, isa):
    assert panels[name, isa].isa().decode() == EXPECTED_PATH[isa]


@pytest.mark.parametrize("name", FORMATS)
def test_a_stack_of_parts_packs_as_their_concatenation(name):
    """A QuantMatrix of parts (a stacked product's q, k and v): each part packed in its place gives the bytes of the
    concatenation's panels, with no copy of the rows made or kept; parts that panels cannot hold (40 + 8 rows) or
    ``panels=False``: one copy of the rows, the concatenation's blocks."""
    qtype = FORMATS[name][0]
    W = synthetic(name, 80, 512, seed=5).reshape(80, -1)
    x = torch.from_numpy(activations(3, 512, seed=6))
    parts = [np.ascontiguousarray(W[a:b]) for a, b in ((0, 48), (48, 64), (64, 80))]
    whole, stack = QuantMatrix(W, qtype, 512), QuantMatrix(parts, qtype, 512, threads=2)
    assert stack.kernel == whole.kernel == f"{name}16" and stack.rows == 80
    assert stack.blocks is None and np.array_equal(stack.data, whole.data) and torch.equal(stack(x), whole(x))
    with pytest.raises(ValueError, match="take_rows needs the file's blocks"):
        stack.take_rows(np.arange(16))
    for blocks, panels in (([np.ascontiguousarray(W[:40]), np.ascontiguousarray(W[40:48])], True), (parts, False)):
        copied = QuantMatrix(blocks, qtype, 512, panels=panels)
        assert copied.kernel == name and copied.data is copied.blocks
        assert np.array_equal(copied.blocks, np.concatenate(blocks))
    with pytest.raises(ValueError, match="one row size"):
        QuantMatrix([parts[0], parts[1][:, :-1].copy()], qtype, 512)
