"""Files of the 32-weight block types Q4_0, Q4_1, Q5_1 and IQ4_NL through the native model (their kernels:
test_native_q32_types.py).

A tiny random Llama (tiny_gguf, float32) is quantized by llama.cpp's own quantizer (llama_cpp's
``llama_model_quantize``, ``pure``: every matrix, the head and the embedding of the one type). The quantized file
loads natively, every matrix multiplied over its stored blocks (nothing de-quantized to float32), and gives the
logits of its float32 twin (the same file with gguf's de-quantized weights: one model, exact weights) within the
int8 activations' rounding, and llama.cpp's own logits on the same file; a token's logits are bit for bit the same
alone or in blocks of 2..16, and the AVX2 and scalar builds give the native build's bits.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from specdec.models.native import NativeModel, NativeSettings

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

FTYPES = {T.Q4_0: 2, T.Q4_1: 3, T.Q5_1: 9, T.IQ4_NL: 25}  # llama_ftype LLAMA_FTYPE_MOSTLY_*
NAMES = [t.name for t in FTYPES]
VOCAB = 8
HAS_AVX2 = "avx2" in open("/proc/cpuinfo").read()


def quantize(llama_cpp, source: str, out: str, ftype: int) -> str:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.pure, params.nthread = ftype, True, 1
    assert llama_cpp.llama_model_quantize(source.encode(), out.encode(), params) == 0, out
    return out


def float32_twin(source: str, quantized: str, out: str) -> str:
    """``source`` (float32) with every tensor that ``quantized`` stores quantized replaced by gguf's de-quantization
    of it: the same model, in float32."""
    shutil.copyfile(source, out)
    mine = {t.name: t for t in gguf.GGUFReader(source).tensors}
    data = np.memmap(out, dtype=np.uint8, mode="r+")
    for t in gguf.GGUFReader(quantized).tensors:
        if t.tensor_type != T.F32:
            assert mine[t.name].tensor_type == T.F32
            values = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
            assert values.nbytes == mine[t.name].n_bytes, t.name
            at = int(mine[t.name].data_offset)
            data[at:at + values.nbytes] = values.view(np.uint8)
    data.flush()
    del data
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{type name: (quantized file, its float32 twin)}."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from tiny_gguf import write_tiny_llama

    folder = tmp_path_factory.mktemp("q32-files")
    source = write_tiny_llama(folder / "f32.gguf", vocab=VOCAB, qtype="f32")
    out = {}
    for qtype, ftype in FTYPES.items():
        path = quantize(llama_cpp, source, str(folder / f"{qtype.name}.gguf"), ftype)
        out[qtype.name] = (path, float32_twin(source, path, str(folder / f"{qtype.name}-twin.gguf")))
    return out


def tokens(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, n)]


def load_natively(path: str, monkeypatch, **settings) -> NativeModel:
    """The model, with gguf's de-quantization refused while it loads and reads (no float32 copy of anything but
    F32 tensors)."""
    real = gguf.quants.dequantize

    def refuse(data, qtype):
        assert qtype == T.F32, f"{qtype.name} de-quantized to float32"
        return real(data, qtype)

    monkeypatch.setattr(gguf.quants, "dequantize", refuse)
    model = NativeModel(path, NativeSettings(threads=2, **settings))
    model.prefill(tokens(5, seed=9))
    monkeypatch.setattr(gguf.quants, "dequantize", real)
    return model


@pytest.mark.parametrize("name", NAMES)
def test_the_file_is_of_the_type(files, name):
    quantized = gguf.GGUFReader(files[name][0])
    matrices = [t for t in quantized.tensors if len(t.shape) >= 2]
    assert len(matrices) == 2 + 2 * 7  # embedding, head, 7 per layer
    assert {t.tensor_type.name for t in matrices} == {name}


@pytest.mark.parametrize("name", NAMES)
def test_reads_natively_and_matches_the_float32_twin(files, name, monkeypatch):
    path, twin = files[name]
    model = load_natively(path, monkeypatch)
    matrices = [m.matrix for layer in model.layers for m in layer.linears()]
    assert {m.qtype.name for m in matrices + [model.head.matrix]} == {name}  # every matrix over its blocks
    ours, want, error = twin_error(model, twin)
    # the int8 activations per 32 weights (as llama.cpp's): about 1% off; a wrong code, scale or min is 10-100%
    assert error < 0.03, name
    assert float((ours.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.9


@pytest.mark.parametrize("name", NAMES)
def test_matches_llama_cpp_on_the_same_file(files, name):
    assert llama_cpp_error(files[name][0]) < 0.03, name


@pytest.mark.parametrize("context", [1, 37])
@pytest.mark.parametrize("name", NAMES)
def test_block_scores_equal_one_token_scores_bitwise(files, name, context):
    assert_blocks_bitwise(files[name][0], name, context)


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
@pytest.mark.parametrize("name", NAMES)
def test_every_instruction_set_gives_the_same_logits(files, name, isa):
    assert_isa_gives_native_bits(files[name][0], isa)


# --- checks every model-level kernel test runs on its files (test_native_kquant_model, test_native_iq_float_model) ---
def twin_error(model: NativeModel, twin: str) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(ours, the float32 twin's, |ours - twin| / |twin|) logits of 48 tokens; the twin is asserted float32."""
    reference = NativeModel(twin, NativeSettings(threads=2))  # float32 weights: the f32 kernel
    assert {layer.o.matrix.qtype for layer in reference.layers} == {T.F32}
    ids = tokens(48)
    model.prefill([])
    reference.prefill([])
    ours, want = model.score(ids), reference.score(ids)
    assert want.std() > 1.0
    return ours, want, float((ours - want).norm() / want.norm())


def llama_cpp_error(path: str) -> float:
    """|ours - llama.cpp's| / |llama.cpp's| logits of 40 tokens on the same file (float32 KV cache on both sides)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    ids = tokens(40)
    theirs = llama_cpp.Llama(model_path=path, n_ctx=64, n_threads=1, logits_all=True, verbose=False,
                             type_k=0, type_v=0)
    theirs.eval(ids)
    want = torch.tensor(np.array(theirs.scores[: len(ids)]), dtype=torch.float32)
    model = NativeModel(path, NativeSettings(threads=1))
    model.prefill([])
    got = model.score(ids)
    assert want.std() > 1.0
    return float((got - want).norm() / want.norm())


def assert_blocks_bitwise(path: str, label: str, context: int) -> None:
    """A token's logits bit for bit the same alone and in blocks of 2..16, after ``context`` tokens."""
    model = NativeModel(path, NativeSettings(threads=2))
    prompt, block = tokens(context, seed=context), tokens(16, seed=context + 1)
    model.prefill(prompt)
    alone = torch.stack([model.score([t])[0] for t in block])
    for k in range(2, 17):
        model.trim(context)
        assert torch.equal(model.score(block[:k]), alone[:k]), f"{label}, context {context}, block of {k}"


def assert_isa_gives_native_bits(path: str, isa: str) -> None:
    """The ``isa`` build's logits (prompt product, then scoring) equal the native build's bit for bit."""
    if isa == "avx2" and not HAS_AVX2:
        pytest.skip("this CPU has no AVX2")
    ids = tokens(40, seed=11)
    native = NativeModel(path, NativeSettings(threads=2))
    other = NativeModel(path, NativeSettings(threads=2, isa=isa))
    native.prefill(ids[:30])  # the prompt product
    other.prefill(ids[:30])
    assert torch.equal(other.score(ids[30:]), native.score(ids[30:]))
