"""Q4_0 in panels of 16 output rows (specdec/native/q4_0p16.cpp over panels32.h) under every isa this CPU runs.

The panels decode to gguf's float32 values bit for bit; the product equals Q4_0's prompt-reading product of the
file's blocks (q4_0.cpp mode 2, prompt32.h, and its reference, mode 3) bit for bit in every mode (0 fast, 1 the
reference, 2 a prompt, 4 never AMX), row count and isa (and an AVX2 + AVX-VNNI build where the CPU has AVX-VNNI),
for K of one block, of the draft's 896 (28 blocks) and of its 4864; every row alone equals the same row inside blocks
of 2..40 rows at several positions; 1 thread equals 2; bad shapes are refused. And the models' use of them: a Q4_0
matrix whose rows are a multiple of 16 runs on its panels (other row counts on the blocks), a cut of it keeps the
arithmetic of its rows, and the file's pages are let go.
"""

from __future__ import annotations

import ctypes
import subprocess

import gguf
import numpy as np
import pytest
import test_native_panels
import torch
from test_native_kernels import EXPECTED_PATH, FLAGS, ISAS, activations, same_bits
from test_native_q32_types import random_blocks

from specdec.cache import cache_dir
from specdec.native import build
from specdec.native.kernels import QuantMatrix

P, INT = ctypes.c_void_p, ctypes.c_int
Q4_0 = gguf.GGMLQuantizationType.Q4_0
NAME, BB = "q4_0p16", 18
pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler")
SHAPES = [(48, 32), (48, 896), (32, 4864)]  # one block; the draft's rows (28 blocks, not a multiple of 8); its ffn_down


class Panels(test_native_panels.Panels):
    """ctypes view of q4_0p16 and of q4_0 (the blocks' kernels) built for one isa."""

    def __init__(self, isa: str, lib: ctypes.CDLL | None = None) -> None:
        super().__init__("q4_0", isa, lib, panel=NAME, bb=BB)

    def pack(self, W: np.ndarray, N: int, K: int) -> np.ndarray:
        out = super().pack(W, N, K)
        assert out.size == W.size + (K // 32 % 2) * N * 2  # the file's bytes, re-laid out (odd blocks: + 32 a panel)
        return out


@pytest.fixture(scope="module")
def panels() -> dict[str, Panels]:
    return {isa: Panels(isa) for isa in ISAS}


@pytest.fixture(scope="module")
def draft_rows() -> list[tuple[str, np.ndarray, int, int]]:
    """Rows of a re-quantized draft's Q4_0 matrices (specdec.loading.requantize), when one is cached: 64 rows of
    the first K = 896 matrix and 32 of the first wider one."""
    out = []
    for path in sorted((cache_dir() / "requantized").glob("*.q4_0.*.gguf"))[:1]:
        seen = set()
        for t in gguf.GGUFReader(path).tensors:
            K, N = int(t.shape[0]), int(t.shape[1]) if len(t.shape) > 1 else 1
            if t.tensor_type != Q4_0 or K in seen or N < 64:
                continue
            seen.add(K)
            raw = np.asarray(t.data).reshape(N, -1).view(np.uint8)
            rows = np.r_[0:32, N - 32:N] if K == 896 else np.r_[0:32]
            out.append((t.name, np.ascontiguousarray(raw[rows]).reshape(-1), len(rows), K))
    return out


def cases(draft_rows) -> list[tuple[str, np.ndarray, int, int]]:
    """(label, blocks, N, K): synthetic blocks (random codes; zero, subnormal and negative scales; a block of all
    codes 15 and one of all 0) of SHAPES, and a re-quantized draft's rows where cached."""
    out = [(f"synthetic {N}x{K}", random_blocks("q4_0", N, K, seed=K).reshape(-1), N, K) for N, K in SHAPES]
    return out + list(draft_rows)


def test_panels_decode_as_gguf(panels, draft_rows):
    for label, W, N, K in cases(draft_rows):
        expected = np.asarray(gguf.quants.dequantize(W.reshape(N, -1), Q4_0), dtype=np.float32).reshape(N, K)
        for isa in ISAS:
            kern = panels[isa]
            got, packed = np.full((N, K), np.nan, np.float32), kern.pack(W, N, K)
            kern.dequant(packed.ctypes.data, N, K, got.ctypes.data)
            assert same_bits(got, expected), (label, isa)


def test_the_prompt_products_bits_in_every_mode_and_isa(panels, draft_rows):
    """Modes 0 (the fast path), 1 (the reference), 2 (a prompt), 4 (never AMX) of every isa == the blocks'
    prompt-reading product (modes 2, 3)."""
    assert_prompt_products_bits(panels, cases(draft_rows), (1, 3, 8, 9, 17, 33, 40))


def assert_prompt_products_bits(panels, cases, rows) -> None:
    """For each case and row count: modes 0, 1, 2, 4 of every isa's panels, and the blocks' prompt product (mode 2),
    == the blocks' prompt-product reference (mode 3), bit for bit."""
    for label, W, N, K in cases:
        packed = {isa: panels[isa].pack(W, N, K) for isa in ISAS}
        for k in rows:
            x = activations(k, K, seed=k)
            ref = panels["native"].prompt_product(W, N, K, x, 3)
            for isa in ISAS:
                kern = panels[isa]
                assert same_bits(kern.prompt_product(W, N, K, x, 2), ref), (label, k, isa)
                for mode in (0, 1, 2, 4):
                    assert same_bits(kern.gemm(packed[isa], N, K, x, mode), ref), (label, k, isa, mode)


@pytest.mark.parametrize("isa", ISAS)
def test_a_row_alone_is_the_same_row_in_any_block(panels, draft_rows, isa):
    """Every row alone == inside blocks of 2..40 rows (groups of at most 8; 6 on AVX2) at 3 positions; 1 thread = 2."""
    kern = panels[isa]
    for label, W, N, K in cases(draft_rows)[:2] + cases(draft_rows)[3:4]:
        test_native_panels.assert_rows_alone_equal_blocks(kern, W, N, K, label)


@pytest.fixture(scope="module")
def vnni_panels(tmp_path_factory) -> Panels:
    """The AVX2 path with AVX-VNNI dot products (-mavxvnni), compiled here: build.py has no such isa."""
    if not {"avx_vnni", "avx2", "fma", "f16c"} <= FLAGS:
        pytest.skip("this CPU has no AVX-VNNI")
    so = tmp_path_factory.mktemp("vnni") / f"lib{NAME}_vnni.so"
    done = subprocess.run([build.compiler(), *build.COMMON_FLAGS, "-march=x86-64-v3", "-mf16c", "-mavxvnni",
                           "-o", str(so), str(build.HERE / f"{NAME}.cpp")], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"the compiler cannot build with -mavxvnni: {done.stderr[-500:]}")
    return Panels("native", ctypes.CDLL(str(so)))


def test_avxvnni_variant(vnni_panels, draft_rows):
    assert vnni_panels.isa().decode() == "avx2"
    for label, W, N, K in cases(draft_rows):
        packed = vnni_panels.pack(W, N, K)
        for k in (1, 5, 9, 17):
            x = activations(k, K, seed=k + 7)
            assert same_bits(vnni_panels.gemm(packed, N, K, x), vnni_panels.prompt_product(W, N, K, x, 3)), (label, k)


def test_bad_shapes_are_refused(panels):
    kern = panels["native"]
    W = random_blocks("q4_0", 24, 64).reshape(-1)
    out = np.zeros(kern._bytes(32, 64), np.uint8)
    assert kern._pack(W.ctypes.data, 24, 64, out.ctypes.data, 1) == -1  # rows not a multiple of 16
    assert kern._pack(W.ctypes.data, 16, 80, out.ctypes.data, 1) == -1  # columns not a multiple of 32
    assert kern._pack(W.ctypes.data, 16, 0, out.ctypes.data, 1) == -1  # no columns
    x, y = np.zeros((1, 64), np.float32), np.zeros((1, 24), np.float32)
    assert kern._gemm(out.ctypes.data, 24, 64, x.ctypes.data, 1, y.ctypes.data, 1, 0) == -1
    assert kern._gemm(out.ctypes.data, 16, 80, x.ctypes.data, 1, y.ctypes.data, 1, 0) == -1
    assert kern._gemm(out.ctypes.data, 16, 0, x.ctypes.data, 1, y.ctypes.data, 1, 0) == -1


def test_isa_path(panels):
    for isa in ISAS:
        assert panels[isa].isa().decode() == EXPECTED_PATH[isa], isa


def test_a_q4_0_matrix_runs_on_panels_where_its_rows_allow(tmp_path):
    K = 896
    W = random_blocks("q4_0", 48, K, seed=2)
    x = torch.from_numpy(activations(5, K, seed=4))
    on, off = QuantMatrix(W, Q4_0, K), QuantMatrix(W, Q4_0, K, panels=False)
    odd = QuantMatrix(np.ascontiguousarray(W[:40]), Q4_0, K)
    assert (on.kernel, off.kernel, odd.kernel) == ("q4_0p16", "q4_0", "q4_0")
    assert on.data is not on.blocks and off.data is off.blocks
    ref = torch.from_numpy(Panels("native").prompt_product(W.reshape(-1), 48, K, x.numpy(), 3))
    assert torch.equal(on(x), ref) and torch.equal(on(x, mode=2), ref)  # the panels: the prompt product's bits
    assert torch.equal(off(x, mode=2), ref)  # the blocks' prompt product
    assert torch.allclose(off(x), ref, rtol=1e-4, atol=1e-3)  # the blocks' scoring kernel: another summation order
    cut = on.take_rows(np.arange(16, 48))  # 32 rows: panels again, the same bits as those rows of the whole
    assert cut.kernel == "q4_0p16" and torch.equal(cut(x), on(x)[:, 16:48])
    uncut = on.take_rows(np.arange(0, 40))  # 40 rows: the blocks
    assert uncut.kernel == "q4_0" and torch.equal(uncut(x, mode=2), ref[:, :40])
    # from a read-only file mapping: the same results after its pages are let go (read again from the file)
    path = tmp_path / "w.bin"
    W.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r").reshape(48, -1)
    from_file = QuantMatrix(mapped, Q4_0, K)
    assert torch.equal(from_file(x), ref) and np.array_equal(np.asarray(from_file.blocks), W)


def test_a_stack_of_q4_0_parts_packs_as_their_concatenation():
    """Q4_0's panels of parts (test_native_panels' test of the 256-weight formats): the concatenation's bytes."""
    K = 896
    W = random_blocks("q4_0", 48, K, seed=3)
    parts = [np.ascontiguousarray(W[a:b]) for a, b in ((0, 32), (32, 48))]
    whole, stack = QuantMatrix(W, Q4_0, K), QuantMatrix(parts, Q4_0, K, threads=2)
    assert stack.kernel == whole.kernel == "q4_0p16" and stack.blocks is None
    assert np.array_equal(stack.data, whole.data)
