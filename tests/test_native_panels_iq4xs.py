"""IQ4_XS in panels of 16 output rows (specdec/native/iq4_xsp16.cpp over panels32.h's driver) under every isa this CPU
runs: the panels decode to gguf's float32 values bit for bit; the product equals IQ4_XS's prompt-reading product of
the file's blocks (iq4_xs.cpp mode 2, prompt32.h, and its reference, mode 3) bit for bit in every mode, row count and
isa (and an AVX2 + AVX-VNNI build where the CPU has AVX-VNNI); every row alone equals the same row inside blocks of
2..40 rows; bad shapes are refused; and a model's IQ4_XS matrix whose rows are a multiple of 16 runs on them.
"""

from __future__ import annotations

import subprocess

import gguf
import numpy as np
import pytest
import test_native_panels
import test_native_panels32
import torch
from test_native_iq_float_types import iq4_xs_blocks
from test_native_kernels import EXPECTED_PATH, FLAGS, ISAS, activations, same_bits

from specdec.native import build
from specdec.native.kernels import QuantMatrix

IQ4_XS = gguf.GGMLQuantizationType.IQ4_XS
NAME = "iq4_xsp16"
pytestmark = pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler")
SHAPES = [(32, 256), (48, 1536), (16, 8960)]  # one superblock; the target's hidden size; its ffn_down rows


class Panels(test_native_panels.Panels):
    """ctypes view of iq4_xsp16 and of iq4_xs (the blocks' kernels) built for one isa."""

    def __init__(self, isa: str, lib=None) -> None:
        super().__init__("iq4_xs", isa, lib, panel=NAME, bb=17)

    def pack(self, W: np.ndarray, N: int, K: int) -> np.ndarray:
        out = super().pack(W, N, K)
        assert out.size == N // 16 * K // 256 * 2240  # the file's 16 x 136 bytes a superblock, plus 64
        return out


@pytest.fixture(scope="module")
def panels() -> dict[str, Panels]:
    return {isa: Panels(isa) for isa in ISAS}


def cases() -> list[tuple[str, np.ndarray, int, int]]:
    return [(f"synthetic {N}x{K}", iq4_xs_blocks(N, K, seed=K).reshape(-1), N, K) for N, K in SHAPES]


def test_panels_decode_as_gguf(panels):
    for label, W, N, K in cases():
        expected = np.asarray(gguf.quants.dequantize(W.reshape(N, -1), IQ4_XS), dtype=np.float32).reshape(N, K)
        for isa in ISAS:
            got, packed = np.full((N, K), np.nan, np.float32), panels[isa].pack(W, N, K)
            panels[isa].dequant(packed.ctypes.data, N, K, got.ctypes.data)
            assert same_bits(got, expected), (label, isa)


def test_the_prompt_products_bits_in_every_mode_and_isa(panels):
    """Modes 0 (the fast path), 1 (the reference), 2 (a prompt), 4 of every isa == the blocks' prompt-reading
    product (modes 2, 3)."""
    test_native_panels32.assert_prompt_products_bits(panels, cases(), (1, 3, 8, 9, 17))


@pytest.mark.parametrize("isa", ISAS)
def test_a_row_alone_is_the_same_row_in_any_block(panels, isa):
    label, W, N, K = cases()[1]
    if isa == "scalar":
        W, N = W[: 16 * K // 256 * 136], 16  # the scalar path is slow: fewer rows
    test_native_panels.assert_rows_alone_equal_blocks(panels[isa], W, N, K, label)


def test_avxvnni_variant(tmp_path):
    """The AVX2 path with AVX-VNNI dot products (-mavxvnni), compiled here: build.py has no such isa."""
    if not {"avx_vnni", "avx2", "fma", "f16c"} <= FLAGS:
        pytest.skip("this CPU has no AVX-VNNI")
    import ctypes

    so = tmp_path / f"lib{NAME}_vnni.so"
    done = subprocess.run([build.compiler(), *build.COMMON_FLAGS, "-march=x86-64-v3", "-mf16c", "-mavxvnni",
                           "-o", str(so), str(build.HERE / f"{NAME}.cpp")], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"the compiler cannot build with -mavxvnni: {done.stderr[-500:]}")
    kern = Panels("native", ctypes.CDLL(str(so)))
    assert kern.isa().decode() == "avx2"
    for label, W, N, K in cases():
        packed = kern.pack(W, N, K)
        for k in (1, 5, 9):
            x = activations(k, K, seed=k + 7)
            assert same_bits(kern.gemm(packed, N, K, x), kern.prompt_product(W, N, K, x, 3)), (label, k)


def test_bad_shapes_are_refused(panels):
    kern = panels["native"]
    W = iq4_xs_blocks(24, 512).reshape(-1)
    out = np.zeros(kern._bytes(32, 512), np.uint8)
    assert kern._pack(W.ctypes.data, 24, 512, out.ctypes.data, 1) == -1  # rows not a multiple of 16
    assert kern._pack(W.ctypes.data, 16, 288, out.ctypes.data, 1) == -1  # columns not whole superblocks
    assert kern._pack(W.ctypes.data, 16, 0, out.ctypes.data, 1) == -1
    x, y = np.zeros((1, 512), np.float32), np.zeros((1, 24), np.float32)
    assert kern._gemm(out.ctypes.data, 24, 512, x.ctypes.data, 1, y.ctypes.data, 1, 0) == -1
    assert kern._gemm(out.ctypes.data, 16, 288, x.ctypes.data, 1, y.ctypes.data, 1, 0) == -1


def test_isa_path(panels):
    for isa in ISAS:
        assert panels[isa].isa().decode() == EXPECTED_PATH[isa], isa


def test_an_iq4_xs_matrix_runs_on_panels_where_its_rows_allow():
    K = 512
    W = iq4_xs_blocks(48, K, seed=2)
    x = torch.from_numpy(activations(5, K, seed=4))
    on, off = QuantMatrix(W, IQ4_XS, K), QuantMatrix(W, IQ4_XS, K, panels=False)
    odd = QuantMatrix(np.ascontiguousarray(W[:40]), IQ4_XS, K)
    assert (on.kernel, off.kernel, odd.kernel) == (NAME, "iq4_xs", "iq4_xs")
    ref = off(x, mode=2)  # the blocks' prompt product
    assert torch.equal(on(x), ref) and torch.equal(on(x, mode=2), ref)
    cut = on.take_rows(np.arange(16, 48))
    assert cut.kernel == NAME and torch.equal(cut(x), on(x)[:, 16:48])
    stack = QuantMatrix([np.ascontiguousarray(W[:32]), np.ascontiguousarray(W[32:])], IQ4_XS, K)
    assert stack.kernel == NAME and np.array_equal(stack.data, on.data)
