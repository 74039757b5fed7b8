"""The native backend's Llama, Qwen3 and Gemma 3 (specdec.models.archs) on tiny random GGUF files (tiny_archs):
the same guarantees as Qwen2's (test_native_model.py).

Per architecture: the forward pass against transformers running the same de-quantized weights (an oracle for the
rotary layout and frequencies, the q/k and post norms, the window, GeGLU, the embedding scale, the tied head);
a token's logits bit for bit the same alone or in blocks of 2..16 at several context lengths (past Gemma's
window too), and in ``score_many`` beside other sequences; the AVX2 and scalar builds bit for bit the native
one; greedy speculative decoding = plain decoding. Also: Llama against llama.cpp itself on float32 weights, the
config each architecture reads from the metadata, the layouts refused, and the adjacent-pair rotary on its own.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from tiny_archs import ARCHS, GEMMA_PATTERN, VOCAB, WINDOW, llama3_factors, transformers_twin, write_tiny

from specdec import ModelDrafter, SamplingParams, autoregressive_generate, speculative_generate
from specdec.models.native import NativeModel, NativeSettings
from specdec.native import kernels as ops

HAS_AVX2 = "avx2" in open("/proc/cpuinfo").read()


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-archs")
    return {arch: (write_tiny(folder / f"{arch}-target.gguf", arch, seed=0),
                   write_tiny(folder / f"{arch}-draft.gguf", arch, seed=1)) for arch in ARCHS}


@pytest.fixture(scope="module")
def models(paths):
    return {arch: NativeModel(paths[arch][0], NativeSettings(threads=2)) for arch in ARCHS}


def tokens(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, n)]


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_matches_transformers_on_the_same_weights(paths, models, arch):
    ids = tokens(60)  # past Gemma's window of 24
    model = models[arch]
    model.prefill([])
    ours = model.score(ids)
    with torch.no_grad():
        reference = transformers_twin(paths[arch][0], arch)(torch.tensor([ids])).logits[0]
    assert ours.shape == reference.shape == (60, VOCAB)
    assert reference.std() > 0.3  # logits that say something (a tied head gives smaller ones)
    # int8 activations per block, as llama.cpp: ≈ 2% off; a wrong rotary, window, norm or activation is 14-87% off
    assert float((ours - reference).norm() / reference.norm()) < 0.05
    assert float((ours.argmax(-1) == reference.argmax(-1)).float().mean()) >= 0.9  # random weights: near-ties


@pytest.mark.parametrize("context", [1, 23, 37, 300, 600])
@pytest.mark.parametrize("arch", ARCHS)
def test_block_scores_equal_one_token_scores_bitwise(models, arch, context):
    """23: blocks that cross Gemma's window; 600: a prompt read in two chunks, blocks past the KV capacity (512)."""
    model = models[arch]
    prompt, block = tokens(context, seed=context), tokens(16, seed=context + 1)
    model.prefill(prompt)
    alone = torch.stack([model.score([t])[0] for t in block])  # [16, vocab]
    for k in (2, 3, 5, 8, 16):
        model.trim(context)
        got = model.score(block[:k])
        assert torch.equal(got, alone[:k]), f"{arch} at {context}, block of {k}: {float((got - alone[:k]).abs().max())}"
    model.trim(context)
    got = torch.cat([model.score(block[:5]), model.score(block[5:])])
    assert torch.equal(got, alone)


@pytest.mark.parametrize("arch", ARCHS)
def test_score_many_gives_each_sequence_its_own_bits(models, arch):
    model = models[arch]
    states, expected = [], []
    for context, k in ((5, 3), (40, 1), (70, 6)):
        model.prefill(tokens(context, seed=context))
        block = tokens(k, seed=context + 1)
        expected.append(model.score(block))
        model.trim(context)
        states.append((model.state(), block))
        model.prefill([])  # a fresh cache for the next sequence
    logits, new_states = model.score_many([s for s, _ in states], [b for _, b in states])
    for got, want, (_, length), ((_, start), block) in zip(logits, expected, new_states, states, strict=True):
        assert torch.equal(got, want) and length == start + len(block)


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
@pytest.mark.parametrize("arch", ARCHS)
def test_every_instruction_set_gives_the_native_builds_logits(paths, models, arch, isa):
    if isa == "avx2" and not HAS_AVX2:
        pytest.skip("this CPU has no AVX2")
    other = NativeModel(paths[arch][0], NativeSettings(threads=2, isa=isa))
    ids = tokens(70, seed=11)  # a prompt past the window, then a block
    for model in (models[arch], other):
        model.prefill(ids[:60])
    assert torch.equal(other.score(ids[60:]), models[arch].score(ids[60:]))


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_speculative_equals_plain_decoding(paths, models, arch):
    draft = NativeModel(paths[arch][1], NativeSettings(threads=1))
    prompt = tokens(30, seed=5)
    greedy = SamplingParams(temperature=0.0)
    plain = autoregressive_generate(models[arch], prompt, max_new_tokens=40, sampling=greedy)
    spec = speculative_generate(models[arch], ModelDrafter(draft), prompt, max_new_tokens=40, gamma=4, sampling=greedy)
    assert spec.tokens == plain.tokens
    assert spec.stats.accepted < spec.stats.drafted  # a different draft: some drafts were rejected


@pytest.mark.parametrize("qtype, tolerance", [("f32", 1e-5), ("q8_0", 0.02)])
def test_llama_matches_llama_cpp_itself(tmp_path, qtype, tolerance):
    """llama.cpp on the same file (tiny_gguf's llama: float32 or Q8_0 matrices, untied head, no rope_freqs): in
    float32 the logits agree to float rounding, so the rotary layout is llama.cpp's own."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from tiny_gguf import write_tiny_llama

    path = write_tiny_llama(tmp_path / f"llama-{qtype}.gguf", vocab=8, qtype=qtype)
    ids = [int(t) for t in np.random.default_rng(0).integers(0, 8, 40)]
    theirs = llama_cpp.Llama(model_path=path, n_ctx=64, n_threads=1, logits_all=True, verbose=False,
                             type_k=0, type_v=0)  # float32 KV cache
    theirs.eval(ids)
    want = torch.tensor(np.array(theirs.scores[: len(ids)]), dtype=torch.float32)
    model = NativeModel(path, NativeSettings(threads=1))
    model.prefill([])
    got = model.score(ids)
    assert want.std() > 1.0 and float((got - want).norm() / want.norm()) < tolerance


def test_each_architecture_reads_its_layout_from_the_metadata(models):
    llama, qwen3, gemma = models["llama"].config, models["qwen3"].config, models["gemma3"].config
    assert (llama.rope_layout, llama.rope_factors, llama.head_dim) == (ops.ROPE_NORM, "rope_freqs.weight", 64)
    factors = torch.from_numpy(llama3_factors(64))
    assert factors.min() == 1 and factors.max() == 8  # the three regimes of a llama3 scaling
    base = 1.0 / (5e5 ** (torch.arange(0, 32, dtype=torch.float32) / 32))
    assert torch.equal(models["llama"].layers[0].inv_freq, base / factors)
    assert (qwen3.head_dim, qwen3.heads * qwen3.head_dim, qwen3.hidden, qwen3.qk_norm) == (128, 512, 256, True)
    assert (gemma.activation, gemma.post_norms, gemma.embed_scale) == (ops.ACT_GELU_TANH, True, 16.0)
    assert [layer.window for layer in gemma.layer] == [WINDOW if s else 0 for s in GEMMA_PATTERN]
    assert [layer.rope_base for layer in gemma.layer] == [1e4 if s else 1e6 for s in GEMMA_PATTERN]
    assert all(layer.scale == np.float32(1 / np.sqrt(np.float32(128))) for layer in gemma.layer)


def test_gemma3_layers_follow_llama_cpps_pattern():
    from specdec.models.archs.gemma3 import sliding_layers

    class File:
        path = "g.gguf"

        def __init__(self, fields):
            self.fields = fields

    assert sliding_layers(File({}), 13) == [i % 6 != 5 for i in range(13)]  # default period 6: 5, 11 global
    assert sliding_layers(File({"gemma3.attention.sliding_window_pattern": 2}), 4) == [True, False, True, False]
    assert sliding_layers(File({"gemma3.attention.sliding_window_pattern": [False, True]}), 2) == [False, True]
    with pytest.raises(ValueError, match="g.gguf: gemma3.attention.sliding_window_pattern has 2 flags for 3 layers"):
        sliding_layers(File({"gemma3.attention.sliding_window_pattern": [False, True]}), 3)


def test_rope_norm_rotates_adjacent_pairs_and_is_row_exact():
    k, heads, d, start = 5, 3, 64, 41
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, d // 2, dtype=torch.float32) * 2 / d))
    x = torch.randn(k, heads, d, generator=torch.Generator().manual_seed(0))
    got = ops.rope_norm(x.clone(), start, inv_freq)
    angles = torch.outer(torch.arange(start, start + k, dtype=torch.float64), inv_freq.double())[:, None]
    even, odd = x[..., 0::2].double(), x[..., 1::2].double()
    want = torch.stack([even * angles.cos() - odd * angles.sin(), odd * angles.cos() + even * angles.sin()], -1)
    torch.testing.assert_close(got.double(), want.reshape(k, heads, d), rtol=1e-4, atol=1e-4)
    for i in range(k):
        assert torch.equal(ops.rope_norm(x[i : i + 1].clone(), start + i, inv_freq)[0], got[i])


def test_real_gemma3_config_is_llama_cpps():
    """The real Gemma 3 270M file (``specdec[gemma3]``, which scripts/test.sh installs; assembled here if needed): a
    skip without it, a failure under SPECDEC_REQUIRE_REAL."""
    from specdec.loading import zoo
    from specdec.models.archs import read_config
    from specdec.native.gguf_file import GGUFFile

    if zoo.missing_packages(zoo.GEMMA3_270M):
        if os.environ.get("SPECDEC_REQUIRE_REAL"):
            pytest.fail(f"SPECDEC_REQUIRE_REAL is set but the Gemma 3 270M file is not installed "
                        f"({zoo.GEMMA3_270M.install})")
        pytest.skip(f"the Gemma 3 270M file is not installed ({zoo.GEMMA3_270M.install})")
    config = read_config(GGUFFile(str(zoo.ensure_gguf(zoo.GEMMA3_270M, progress=False))))
    assert (config.layers, config.hidden, config.heads, config.kv_heads, config.head_dim) == (18, 640, 4, 1, 256)
    assert [i for i, layer in enumerate(config.layer) if layer.window == 0] == [5, 11, 17]
    assert {(layer.window, layer.rope_base) for layer in config.layer} == {(512, 1e4), (0, 1e6)}


class Fields:
    """A qwen3 GGUFFile's metadata without a file."""

    path = "m.gguf"

    def __init__(self, **fields):
        named = {f"qwen3.{key.replace('__', '.')}": value for key, value in fields.items()}
        self.fields = {"general.architecture": "qwen3"} | named

    def field(self, name):
        if name not in self.fields:
            raise ValueError(f"metadata {name!r} is missing")
        return self.fields[name]


QWEN3 = dict(embedding_length=256, attention__head_count=4, feed_forward_length=512, block_count=2, context_length=64,
             attention__layer_norm_rms_epsilon=1e-6)


@pytest.mark.parametrize("extra, message", [
    ({"rope__scaling__type": "yarn"}, "rotary scaling 'yarn' is not supported by the native backend"),
    ({"attention__key_length": 40}, "qwen3.attention.key_length = 40 is not supported by the native backend"),
    ({"rope__dimension_count": 32}, "rotary over 32 of 64 head dimensions is not supported"),
    ({"expert_count": 8}, "mixture-of-experts layers are not supported"),
    ({"attention__head_count": [4, 4]}, "per-layer head or feed-forward counts are not supported"),
])
def test_layouts_the_runner_lacks_are_refused_in_one_line(extra, message):
    from specdec.models.archs import read_config

    assert read_config(Fields(**QWEN3)).head_dim == 64  # the same metadata without the extra key is read
    with pytest.raises(ValueError, match=f"^m.gguf: {message}.*; use --backend transformers or llamacpp$"):
        read_config(Fields(**(QWEN3 | extra)))


def test_a_linear_rotary_scaling_divides_the_positions():
    from specdec.models.archs import read_config

    scaled = read_config(Fields(**QWEN3, rope__scaling__type="linear", rope__scaling__factor=4.0))
    assert {layer.rope_scale for layer in scaled.layer} == {0.25}
    assert read_config(Fields(**QWEN3, rope__scale_linear=2.0)).layer[0].rope_scale == 0.5  # the older key
    assert read_config(Fields(**QWEN3)).layer[0].rope_scale == 1.0
