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

import pytest
from test_native_q32_model import (
    assert_blocks_bitwise,
    assert_isa_gives_native_bits,
    float32_twin,
    llama_cpp_error,
    load_natively,
    twin_error,
)

from specdec.native.kernels import KERNELS

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402

# file name -> (the type it is about, llama_ftype LLAMA_FTYPE_MOSTLY_*, pure)
FILES = {"Q5_K": (T.Q5_K, 16, True), "Q3_K": (T.Q3_K, 11, True), "Q2_K-pure": (T.Q2_K, 10, True),
         "Q5_K_M": (T.Q5_K, 17, False), "Q3_K_M": (T.Q3_K, 12, False), "Q2_K": (T.Q2_K, 10, False)}
NAMES = list(FILES)


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
    matrices = [m.matrix for layer in model.layers for m in layer.linears()]
    stored = {t.name: t.tensor_type for t in gguf.GGUFReader(path).tensors}
    assert model.head.matrix.qtype == stored["output.weight"]
    assert {m.qtype for m in matrices} == {stored[f"blk.{i}.{n}.weight"] for i in range(2) for n in (
        "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}  # every matrix over its blocks
    ours, want, error = twin_error(model, twin)
    # the int8 activations per 256 weights: about 1% off; a wrong code, scale or min is 10-100%
    assert error < 0.03, name
    assert float((ours.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.9


@pytest.mark.parametrize("name", NAMES)
def test_matches_llama_cpp_on_the_same_file(files, name):
    # llama.cpp reads these types against int8 activations per 256 weights too (Q8_K): within 0.6% here
    assert llama_cpp_error(files[name][0]) < 0.01, name


@pytest.mark.parametrize("context", [1, 37])
@pytest.mark.parametrize("name", NAMES)
def test_block_scores_equal_one_token_scores_bitwise(files, name, context):
    assert_blocks_bitwise(files[name][0], name, context)


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
@pytest.mark.parametrize("name", NAMES)
def test_every_instruction_set_gives_the_same_logits(files, name, isa):
    assert_isa_gives_native_bits(files[name][0], isa)


# (target's llama_ftype, draft's, the panel kernels they must run on): LLAMA_FTYPE_MOSTLY_Q2_K, _Q3_K_M; _Q5_K_M, _Q2_K
PANEL_PAIRS = {"q2k-q3k": (10, 12, {"q2k16", "q3k16"}), "q5k-q2k": (17, 10, {"q5k16", "q2k16"})}


@pytest.mark.parametrize("pair", PANEL_PAIRS)
def test_speculative_sequences_on_kquant_panels_have_the_target_distribution(tmp_path, pair):
    """A target and a draft of llama.cpp's presets (Q2_K and Q3_K_M; Q5_K_M and Q2_K) of two tiny random Llamas of 4
    tokens, rows of 256 and 512 weights, so that their K-quant matrices run on the panels (q2k16, q3k16, q5k16): the
    sequences of speculative sampling at temperature 1, γ 3, over 3000 seeds, against the target's exact
    distribution (chi-square, false-alarm rate 1e-3: test_exactness_native's)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    import tiny_gguf
    from test_exactness import chi_square_pvalue
    from test_exactness_native import ALPHA, RUNS, exact_distribution, speculative_counts

    from specdec import SamplingParams
    from specdec.models.native import NativeModel, NativeSettings

    models = []
    target_ftype, draft_ftype, expected = PANEL_PAIRS[pair]
    for name, seed, ftype in (("target", 3, target_ftype), ("draft", 4, draft_ftype)):
        source = tiny_gguf.write_tiny_llama(tmp_path / f"{name}-f32.gguf", vocab=4, seed=seed, head_scale=0.2,
                                            qtype="f32", n_embd=256, n_ff=512)
        path = str(tmp_path / f"{name}.gguf")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.nthread = ftype, 1
        assert llama_cpp.llama_model_quantize(str(source).encode(), path.encode(), params) == 0, path
        models.append(NativeModel(path, NativeSettings(1)))
    target, draft = models
    kernels = {m.matrix.kernel for model in models for layer in model.layers for m in layer.linears()}
    assert expected <= kernels, kernels
    sampling = SamplingParams(temperature=1.0)
    dist = exact_distribution(target, sampling)
    assert sum(p * RUNS >= 5 for p in dist.values()) >= 30  # a spread-out target: the test has power
    counts, accepted, drafted = speculative_counts(target, draft, sampling, 3)
    assert 0 < accepted < drafted  # the rule both kept and rejected drafts
    assert chi_square_pvalue(counts, dist, RUNS) > ALPHA
