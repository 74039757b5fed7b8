"""Files of the K-quant types Q5_K, Q3_K and Q2_K through the native model (their kernels:
test_native_kquant_types.py).

A tiny random Llama (tiny_gguf's, widened to rows of 256 and 512 weights, the K-quants' block: float32) is quantized
by llama.cpp's own quantizer (llama_cpp's ``llama_model_quantize``) twice per type: ``pure`` (every matrix, the head
and the embedding of the one type) and as llama-quantize's preset (``Q5_K_M``, ``Q3_K_M``, ``Q2_K``: the type mixed
with Q4_K, Q6_K and others by llama.cpp's own choice per tensor). The quantized file loads natively, every matrix
multiplied over its stored blocks (nothing de-quantized to float32), and gives the logits of its float32 twin (the
same file with gguf's de-quantized weights) within the int8 activations' rounding, and llama.cpp's own logits on the
same file; a token's logits are bit for bit the same alone or in blocks of 2..16, and the AVX2 and scalar builds
give the native build's bits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_native_q32_model import float32_twin, load_natively, tokens

from specdec.models.native import NativeModel, NativeSettings
from specdec.native.kernels import KERNELS

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

# file name -> (the type it is about, llama_ftype LLAMA_FTYPE_MOSTLY_*, pure)
FILES = {"Q5_K": (T.Q5_K, 16, True), "Q3_K": (T.Q3_K, 11, True), "Q2_K-pure": (T.Q2_K, 10, True),
         "Q5_K_M": (T.Q5_K, 17, False), "Q3_K_M": (T.Q3_K, 12, False), "Q2_K": (T.Q2_K, 10, False)}
NAMES = list(FILES)
HAS_AVX2 = "avx2" in open("/proc/cpuinfo").read()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{file name: (quantized file, its float32 twin)}."""
    llama_cpp = pytest.importorskip("llama_cpp")
    import tiny_gguf

    folder = tmp_path_factory.mktemp("kquant-files")
    # rows of whole 256-weight blocks
    source = tiny_gguf.write_tiny_llama(folder / "f32.gguf", vocab=8, qtype="f32", n_embd=256, n_ff=512)
    out = {}
    for name, (_, ftype, pure) in FILES.items():
        path = str(folder / f"{name}.gguf")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.pure, params.nthread = ftype, pure, 1
        assert llama_cpp.llama_model_quantize(source.encode(), path.encode(), params) == 0, path
        out[name] = (path, float32_twin(source, path, str(folder / f"{name}-twin.gguf")))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_the_file_is_of_the_type(files, name):
    qtype, _, pure = FILES[name]
    matrices = [t for t in gguf.GGUFReader(files[name][0]).tensors if len(t.shape) >= 2]
    assert len(matrices) == 2 + 2 * 7  # embedding, head, 7 per layer
    kinds = {t.tensor_type for t in matrices}
    if pure:
        assert kinds == {qtype}
    else:  # the preset: the type for most matrices, others where llama.cpp chooses so; all with a kernel
        assert qtype in kinds and len(kinds) > 1 and kinds <= set(KERNELS), kinds
        assert sum(t.tensor_type == qtype for t in matrices) >= 4


@pytest.mark.parametrize("name", NAMES)
def test_reads_natively_and_matches_the_float32_twin(files, name, monkeypatch):
    path, twin = files[name]
    model = load_natively(path, monkeypatch)
    matrices = [getattr(layer, n).matrix for layer in model.layers for n in ("q", "k", "v", "o", "gate", "up", "down")]
    stored = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    assert model.head.matrix.qtype == stored["output.weight"]
    assert {m.qtype for m in matrices} == {stored[f"blk.{i}.{n}.weight"] for i in range(2) for n in (
        "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}  # every matrix over its blocks
    reference = NativeModel(twin, NativeSettings(threads=2))  # float32 weights: the f32 kernel
    assert {layer.q.matrix.qtype for layer in reference.layers} == {T.F32}
    ids = tokens(48)
    model.prefill([])
    reference.prefill([])
    ours, want = model.score(ids), reference.score(ids)
    assert want.std() > 1.0
    # the int8 activations per 256 weights: about 1% off; a wrong code, scale or min is 10-100%
    assert float((ours - want).norm() / want.norm()) < 0.03, name
    assert float((ours.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.9


@pytest.mark.parametrize("name", NAMES)
def test_matches_llama_cpp_on_the_same_file(files, name):
    llama_cpp = pytest.importorskip("llama_cpp")
    path = files[name][0]
    ids = tokens(40)
    theirs = llama_cpp.Llama(model_path=path, n_ctx=64, n_threads=1, logits_all=True, verbose=False,
                             type_k=0, type_v=0)  # float32 KV cache
    theirs.eval(ids)
    want = torch.tensor(np.array(theirs.scores[: len(ids)]), dtype=torch.float32)
    model = NativeModel(path, NativeSettings(threads=1))
    model.prefill([])
    got = model.score(ids)
    # llama.cpp reads these types against int8 activations per 256 weights too (Q8_K): within 0.6% here
    assert want.std() > 1.0 and float((got - want).norm() / want.norm()) < 0.01, name


@pytest.mark.parametrize("context", [1, 37])
@pytest.mark.parametrize("name", NAMES)
def test_block_scores_equal_one_token_scores_bitwise(files, name, context):
    model = NativeModel(files[name][0], NativeSettings(threads=2))
    prompt, block = tokens(context, seed=context), tokens(16, seed=context + 1)
    model.prefill(prompt)
    alone = torch.stack([model.score([t])[0] for t in block])
    for k in range(2, 17):
        model.trim(context)
        got = model.score(block[:k])
        assert torch.equal(got, alone[:k]), f"{name}, context {context}, block of {k}"


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
@pytest.mark.parametrize("name", NAMES)
def test_every_instruction_set_gives_the_same_logits(files, name, isa):
    if isa == "avx2" and not HAS_AVX2:
        pytest.skip("this CPU has no AVX2")
    ids = tokens(40, seed=11)
    native = NativeModel(files[name][0], NativeSettings(threads=2))
    other = NativeModel(files[name][0], NativeSettings(threads=2, isa=isa))
    native.prefill(ids[:30])  # the prompt product
    other.prefill(ids[:30])
    assert torch.equal(other.score(ids[30:]), native.score(ids[30:]))
