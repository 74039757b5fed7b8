"""Files of the types IQ4_XS, F16 and BF16 through the native model (their kernels: test_native_iq_float_types.py).

A tiny random Llama (tiny_gguf, float32; 256 wide with a 512 feed-forward for IQ4_XS's 256-weight superblocks) is
quantized by llama.cpp's own quantizer (llama_cpp's ``llama_model_quantize``): ``pure`` (every matrix, the head and
the embedding of the one type) and, for IQ4_XS, the preset as users get it (no importance matrix needed; its head
in Q6_K). The file loads natively with every matrix multiplied over the file's own mapped bytes (nothing de-quantized
to float32, no copy of the weights), and gives: for F16 / BF16 the logits of its float32 twin (the same file with
gguf's de-quantized weights) bit for bit, since their kernels are f32's arithmetic on the same values; for IQ4_XS the
twin's within the int8 activations' rounding; llama.cpp's own logits on the same file; a token's logits bit for bit
the same alone or in blocks of 2..16; the AVX2 and scalar builds the native build's bits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_native_q32_model import (
    assert_blocks_bitwise,
    assert_isa_gives_native_bits,
    float32_twin,
    llama_cpp_error,
    load_natively,
    tokens,
    twin_error,
)

from specdec.models.native import NativeModel, NativeSettings

gguf = pytest.importorskip("gguf")

FILES = {  # name: (llama_ftype LLAMA_FTYPE_MOSTLY_*, pure, matrix types written, width)
    "IQ4_XS": (30, True, {"IQ4_XS"}, 256),
    "IQ4_XS-preset": (30, False, {"IQ4_XS", "Q6_K"}, 256),
    "F16": (1, True, {"F16"}, 64),
    "BF16": (32, True, {"BF16"}, 64),
}
NAMES = list(FILES)
VOCAB = 8


def quantize(llama_cpp, source: str, out: str, ftype: int, *, pure: bool) -> str:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.pure, params.nthread = ftype, pure, 1
    assert llama_cpp.llama_model_quantize(source.encode(), out.encode(), params) == 0, out
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{name: (quantized file, its float32 twin)}."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from tiny_gguf import write_tiny_llama

    folder = tmp_path_factory.mktemp("iq-float-files")
    sources = {w: write_tiny_llama(folder / f"f32-{w}.gguf", vocab=VOCAB, n_embd=w, n_ff=2 * w) for w in (64, 256)}
    out = {}
    for name, (ftype, pure, _, width) in FILES.items():
        path = quantize(llama_cpp, sources[width], str(folder / f"{name}.gguf"), ftype, pure=pure)
        out[name] = (path, float32_twin(sources[width], path, str(folder / f"{name}-twin.gguf")))
    return out


def matrices(model: NativeModel) -> list:
    return [m.matrix for layer in model.layers for m in layer.linears()] + [model.head.matrix]


@pytest.mark.parametrize("name", NAMES)
def test_the_file_is_of_the_type(files, name):
    quantized = gguf.GGUFReader(files[name][0])
    written = [t for t in quantized.tensors if len(t.shape) >= 2]
    assert len(written) == 2 + 2 * 7  # embedding, head, 7 per layer
    assert {t.tensor_type.name for t in written} == FILES[name][2]
    if name == "IQ4_XS-preset":
        assert {t.tensor_type.name for t in written if t.name != "output.weight"} == {"IQ4_XS"}


@pytest.mark.parametrize("name", NAMES)
def test_reads_the_mapped_file_and_matches_the_float32_twin(files, name, monkeypatch):
    path, twin = files[name]
    model = load_natively(path, monkeypatch)
    mapped = model._file._map
    stacks = {id(s.matrix) for layer in model.layers for s in (layer.qkv, layer.gate_up) if s is not None}
    assert stacks  # q, k, v and gate, up of one type: each one copy of their blocks (their file pages let go)
    for m in matrices(model):  # every other matrix over the file's own bytes: no copy; none in float32
        assert m.qtype.name in FILES[name][2], m.qtype.name
        assert id(m) in stacks or np.shares_memory(m.blocks, mapped), m.qtype.name
    assert model._embed_type.name in FILES[name][2] and np.shares_memory(model._embed, mapped)
    ours, want, error = twin_error(model, twin)
    if name in ("F16", "BF16"):  # f32's arithmetic on the same values, the embedding decoded to the same floats
        assert torch.equal(ours, want), name
        reference, ids = NativeModel(twin, NativeSettings(threads=2)), tokens(48)
        model.prefill(ids[:30])  # the prompt product too
        reference.prefill(ids[:30])
        assert torch.equal(model.score(ids[30:]), reference.score(ids[30:]))
    else:  # the int8 activations per 32 weights: about 1% off; a wrong code or scale is 10-100%
        assert error < 0.03, name
        assert float((ours.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.9


@pytest.mark.parametrize("name", NAMES)
def test_matches_llama_cpp_on_the_same_file(files, name):
    assert llama_cpp_error(files[name][0]) < 0.03, name


@pytest.mark.parametrize("name", NAMES)
def test_block_scores_equal_one_token_scores_bitwise(files, name):
    assert_blocks_bitwise(files[name][0], name, 21)


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
@pytest.mark.parametrize("name", NAMES)
def test_every_instruction_set_gives_the_same_logits(files, name, isa):
    assert_isa_gives_native_bits(files[name][0], isa)
