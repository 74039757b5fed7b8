"""The native backend's Phi-3 and Granite (specdec.models.archs.phi3, granite) on tiny random GGUF files
(tiny_more_archs): the guarantees of the other families (test_native_archs.py).

Per family: the forward pass against transformers' Phi3 / Granite on the same de-quantized weights (an oracle for
the fused q/k/v and gate/up, the partial rotary, LongRoPE's short and long factors and attention factor, the
window, Granite's four multipliers, the tied head); llama.cpp itself on a float32 file; a token's logits bit for bit
the same alone or in blocks of 2..16 at several context lengths (across Phi's window and original context) and in
``score_many``; the AVX2 and scalar builds bit for bit the native one; greedy speculative decoding = plain; the
speculative sequences' distribution = the target's (chi-square). Also the layer's rotary on its own, the config
each reads from the metadata, and what each refuses.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_exactness import chi_square_pvalue
from test_exactness_native import ALPHA, RUNS, SETTINGS, exact_distribution, speculative_counts
from tiny_more_archs import (
    ARCHS,
    GRANITE_SCALES,
    HEAD_DIM,
    ORIGINAL,
    ROPE_DIMS,
    VOCAB,
    WINDOW,
    attn_factor,
    longrope_factors,
    transformers_twin,
    write_tiny_more,
)

from specdec import ModelDrafter, SamplingParams, autoregressive_generate, speculative_generate
from specdec.models.native import NativeModel, NativeSettings
from specdec.native import kernels as ops

HAS_AVX2 = "avx2" in open("/proc/cpuinfo").read()


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """arch → (target, draft): the draft is the target's first layer, embedding and head (agreeing often, not all)."""
    folder = tmp_path_factory.mktemp("tiny-more-archs")
    return {arch: (write_tiny_more(folder / f"{arch}-target.gguf", arch, seed=0),
                   write_tiny_more(folder / f"{arch}-draft.gguf", arch, seed=0, layers=1)) for arch in ARCHS}


@pytest.fixture(scope="module")
def models(paths):
    return {arch: NativeModel(paths[arch][0], NativeSettings(threads=2)) for arch in ARCHS}


def tokens(n: int, seed: int = 0, vocab: int = VOCAB) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


def one_call_at_a_time(twin, ids: list[int]) -> torch.Tensor:
    """transformers' logits with each token a call of its own over the cache: its LongRoPE then takes the long
    factors for a token at a position >= the original context and the short ones before (it chooses per call, by
    the longest position in the call)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=twin.config)
    return torch.cat([twin(torch.tensor([[t]]), cache=cache, use_cache=True).logits[0] for t in ids])


def close(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).norm() / reference.norm())


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_matches_transformers_on_the_same_weights(paths, models, arch):
    ids = tokens(60)  # past phi3's window (24) and its original context (32)
    model = models[arch]
    model.prefill([])
    ours = model.score(ids)
    twin = transformers_twin(paths[arch][0], arch)
    with torch.no_grad():
        reference = one_call_at_a_time(twin, ids) if arch == "phi3" else twin(torch.tensor([ids])).logits[0]
    assert ours.shape == reference.shape == (60, VOCAB)
    assert reference.std() > 0.3  # logits that say something
    # int8 activations per block, as llama.cpp: a few % off; a wrong rotary, factor set, window or scale: far more
    assert close(ours, reference) < 0.05
    assert float((ours.argmax(-1) == reference.argmax(-1)).float().mean()) >= 0.9  # random weights: near-ties


def test_phi3_rotates_by_the_short_factors_below_the_original_context_and_by_the_long_ones_from_it(paths, models):
    """transformers in one call over the first ORIGINAL tokens (so its short factors) agrees with ours there; a twin
    whose long factors are its short ones agrees there too but not from position ORIGINAL on, where ours agrees
    with the true twin's (one call a token): both sets are in use, each on its side of ORIGINAL."""
    ids = tokens(48, seed=3)
    model = models["phi3"]
    model.prefill([])
    ours = model.score(ids)
    short, _ = longrope_factors()
    twin, short_only = (transformers_twin(paths["phi3"][0], "phi3", factors=f) for f in (None, (short, short)))
    with torch.no_grad():
        one_call, stepwise = twin(torch.tensor([ids[:ORIGINAL]])).logits[0], one_call_at_a_time(twin, ids)
        never_long = one_call_at_a_time(short_only, ids)
    below, above = slice(0, ORIGINAL), slice(ORIGINAL, None)
    assert close(ours[below], one_call) < 0.05 and close(ours[below], never_long[below]) < 0.05
    assert close(ours[above], stepwise[above]) < 0.05
    assert close(ours[above], never_long[above]) > 0.2  # the long factors do turn on at ORIGINAL


# Q8_0: ours and llama.cpp are each ~2% from the exact product of the de-quantized weights (int8 activations), 1.5%
# from each other on phi3; a wrong rotary width, factor set, attention factor or scale is 25-60% off
@pytest.mark.parametrize("qtype, tolerance", [("f32", 1e-5), ("q8_0", 0.04)])
@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_itself_gives_the_same_logits(tmp_path, arch, qtype, tolerance):
    """llama.cpp on the same file (phi3: the fused tensors, 48 of 64 dimensions rotated, LongRoPE's short factors,
    as llama.cpp takes them within the original context, and its attention factor; granite: the four multipliers,
    the adjacent-pair rotary): in float32 the logits agree to float rounding; in Q8_0 to the activations' int8."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = write_tiny_more(tmp_path / f"{arch}-{qtype}.gguf", arch, vocab=16, qtype=qtype, window=0, original=4096,
                           context=131_072, head_scale=2.0)
    ids = tokens(40, seed=4, vocab=16)
    theirs = llama_cpp.Llama(model_path=path, n_ctx=64, n_threads=1, logits_all=True, verbose=False,
                             type_k=0, type_v=0)  # float32 KV cache
    theirs.eval(ids)
    want = torch.tensor(np.array(theirs.scores[: len(ids)]), dtype=torch.float32)
    model = NativeModel(path, NativeSettings(threads=1))
    model.prefill([])
    got = model.score(ids)
    assert want.std() > 1.0 and close(got, want) < tolerance


@pytest.mark.parametrize("context", [1, 23, 37, 300, 600])
@pytest.mark.parametrize("arch", ARCHS)
def test_block_scores_equal_one_token_scores_bitwise(models, arch, context):
    """23: blocks across phi3's window and its original context (32); 600: a prompt read in two chunks."""
    model = models[arch]
    prompt, block = tokens(context, seed=context), tokens(16, seed=context + 1)
    model.prefill(prompt)
    alone = torch.stack([model.score([t])[0] for t in block])  # [16, vocab]
    for k in (2, 3, 5, 8, 16):
        model.trim(context)
        got = model.score(block[:k])
        assert torch.equal(got, alone[:k]), f"{arch} at {context}, block of {k}: {float((got - alone[:k]).abs().max())}"
    model.trim(context)
    assert torch.equal(torch.cat([model.score(block[:5]), model.score(block[5:])]), alone)


@pytest.mark.parametrize("arch", ARCHS)
def test_score_many_gives_each_sequence_its_own_bits(models, arch):
    model = models[arch]
    states, expected = [], []
    for context, k in ((5, 3), (30, 4), (70, 6)):  # 30 + 4 crosses phi3's original context
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
    ids = tokens(70, seed=11)
    for model in (models[arch], other):
        model.prefill(ids[:60])
    assert torch.equal(other.score(ids[60:]), models[arch].score(ids[60:]))


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_speculative_equals_plain_decoding(paths, models, arch):
    draft = NativeModel(paths[arch][1], NativeSettings(threads=1))
    prompt = tokens(20, seed=5)  # 20 + 40 tokens: across phi3's original context and its window
    greedy = SamplingParams(temperature=0.0)
    plain = autoregressive_generate(models[arch], prompt, max_new_tokens=40, sampling=greedy)
    spec = speculative_generate(models[arch], ModelDrafter(draft), prompt, max_new_tokens=40, gamma=4, sampling=greedy)
    assert spec.tokens == plain.tokens
    assert 0 < spec.stats.accepted < spec.stats.drafted  # drafts both kept and rejected


@pytest.mark.parametrize("arch, setting", [("phi3", "temperature-1"), ("granite", "top-p-0.9")])
def test_speculative_sequences_have_the_target_distribution(tmp_path, arch, setting):
    """test_exactness_native's chi-square over the 64 three-token continuations of a 4-token vocabulary."""
    target, draft = (NativeModel(write_tiny_more(tmp_path / f"{name}.gguf", arch, seed=seed, vocab=4, head_scale=0.2),
                                 NativeSettings(1)) for name, seed in (("target", 3), ("draft", 4)))
    sampling = SETTINGS[setting]
    dist = exact_distribution(target, sampling)
    assert sum(p * RUNS >= 5 for p in dist.values()) >= 30  # a spread-out target: the test has power
    counts, accepted, drafted = speculative_counts(target, draft, sampling)
    assert 0 < accepted < drafted  # the rule both kept and rejected drafts
    assert chi_square_pvalue(counts, dist, RUNS) > ALPHA


@pytest.mark.parametrize("layout", [ops.ROPE_NEOX, ops.ROPE_NORM])
def test_the_layers_rotary_turns_part_of_each_head_by_two_sets_of_frequencies_and_a_factor(layout):
    k, heads, d, n_rot, start, switch, mscale = 6, 3, 64, 48, 29, 32, 1.25
    half = n_rot // 2
    inv_freq = torch.rand(2 * half, generator=torch.Generator().manual_seed(1))  # short, then long
    shape = ops.Shape(256, heads, heads, d, 512, 1e-6, layout, ops.ACT_SILU, n_rot, switch, mscale, 0.0)
    x = torch.randn(k, heads, d, generator=torch.Generator().manual_seed(0))
    got = ops.rope(x.clone(), start, inv_freq, shape)
    want = x.double().clone()
    for r in range(k):
        freq = inv_freq[half:] if start + r >= switch else inv_freq[:half]
        angle = (start + r) * freq.double()
        first, second = (torch.arange(0, n_rot, 2), torch.arange(1, n_rot, 2)) if layout == ops.ROPE_NORM else (
            torch.arange(half), torch.arange(half, n_rot))
        a, b = x[r][:, first].double(), x[r][:, second].double()
        want[r][:, first] = mscale * (a * angle.cos() - b * angle.sin())
        want[r][:, second] = mscale * (b * angle.cos() + a * angle.sin())
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got[..., n_rot:], x[..., n_rot:])  # the rest of each head passes through untouched
    for i in range(k):
        assert torch.equal(ops.rope(x[i : i + 1].clone(), start + i, inv_freq, shape)[0], got[i])
    plain = ops.Shape(256, heads, heads, d, 512, 1e-6, layout, ops.ACT_SILU)  # the four new fields 0: as before
    rotate = ops.rope_norm if layout == ops.ROPE_NORM else ops.rope_neox
    full = torch.rand(d // 2, generator=torch.Generator().manual_seed(2))
    assert torch.equal(ops.rope(x.clone(), start, full, plain), rotate(x.clone(), start, full))


def test_each_family_reads_its_layout_from_the_metadata(paths, models):
    phi, granite = models["phi3"].config, models["granite"].config
    assert (phi.rope_layout, phi.rotary_dims, phi.fused_gate_up, phi.rope_long_from) == (ops.ROPE_NEOX, ROPE_DIMS,
                                                                                         True, ORIGINAL)
    assert (phi.rope_factors, phi.rope_factors_long) == ("rope_factors_short.weight", "rope_factors_long.weight")
    assert phi.rope_mscale == pytest.approx(attn_factor(2048, ORIGINAL), rel=1e-6) and phi.rope_mscale > 1.4
    assert [layer.window for layer in phi.layer] == [WINDOW, WINDOW]
    short, long = (torch.from_numpy(f) for f in longrope_factors())
    base = 1.0 / (1e4 ** (torch.arange(0, ROPE_DIMS // 2, dtype=torch.float32) * 2 / ROPE_DIMS))
    assert torch.equal(models["phi3"].layers[0].inv_freq, torch.cat([base / short, base / long]))
    stacked = models["phi3"].layers[1]  # blk.1.attn_qkv and the fused ffn_up as stored: one product call each
    assert stacked.q is None and stacked.qkv.out_features == 8 * HEAD_DIM and stacked.gate_up.out_features == 1024
    split = NativeModel(paths["phi3"][0], NativeSettings(threads=2, stack=False)).layers[1]
    q, k, v = split.q, split.k, split.v  # parts of blk.1.attn_qkv, views of its rows
    assert split.qkv is None and split.gate_up is None
    assert (q.out_features, k.out_features, v.out_features) == (4 * HEAD_DIM, 2 * HEAD_DIM, 2 * HEAD_DIM)
    assert k.matrix.blocks.ctypes.data == q.matrix.blocks.ctypes.data + q.matrix.blocks.nbytes  # no copy
    assert split.gate.out_features == split.up.out_features == 512
    s = GRANITE_SCALES
    assert (granite.rope_layout, granite.rotary_dims, granite.rope_long_from) == (ops.ROPE_NORM, HEAD_DIM, 0)
    assert (granite.embed_scale, granite.logit_scale) == (s["embedding"], s["logit"])
    assert granite.residual_scale == np.float32(s["residual"]) and granite.rope_mscale == 1.0
    assert all(layer.scale == s["attention"] and layer.window == 0 for layer in granite.layer)


class Fields:
    """A GGUFFile's metadata and tensor names, without a file."""

    path = "m.gguf"

    def __init__(self, arch, tensors=(), **fields):
        self.fields = {"general.architecture": arch} | {f"{arch}.{key.replace('__', '.')}": value
                                                        for key, value in fields.items()}
        self.tensors = dict.fromkeys(tensors)

    def field(self, name):
        if name not in self.fields:
            raise ValueError(f"{self.path}: GGUF metadata {name!r} is missing")
        return self.fields[name]


BASE = dict(embedding_length=256, attention__head_count=4, feed_forward_length=512, block_count=2, context_length=64,
            attention__layer_norm_rms_epsilon=1e-6)
FACTORS = ("rope_factors_short.weight", "rope_factors_long.weight")


@pytest.mark.parametrize("arch, tensors, extra, message", [
    ("granite", (), {"logit_scale": None}, "GGUF metadata 'granite.logit_scale' is missing"),
    ("granite", (), {"logit_scale": 0.0}, "granite.logit_scale = 0 is not supported"),
    ("granite", (), {"rope__scaling__finetuned": False}, "granite.rope.scaling.finetuned = False"),
    ("granite", (), {"rope__dimension_count": 32},
     r"rotary over 32 of 64 head dimensions is not supported by the native backend for granite "
     r"\(granite.rope.dimension_count = 32\)"),
    ("granite", (), {"rope__scaling__type": "longrope"}, "granite.rope.scaling.type = 'longrope' without"),
    ("phi3", FACTORS[:1], {}, "LongRoPE factors without rope_factors_long.weight are not supported"),
    ("phi3", (), {"rope__dimension_count": 31}, r"rotary over 31 of 64 head dimensions .*= 31\)"),
    ("phi3", FACTORS, {"rope__scaling__type": "yarn"},
     r"rotary scaling 'yarn' is not supported by the native backend for phi3 \(phi3.rope.scaling.type; "
     r"supported: none, linear, longrope\)"),
])
def test_what_each_family_lacks_is_refused_in_one_line_naming_the_key(arch, tensors, extra, message):
    from specdec.models.archs import read_config

    plain = BASE | ({"logit_scale": 8.0} if arch == "granite" else {})
    assert read_config(Fields(arch, (), **plain)).head_dim == 64  # the metadata without the change is read
    fields = {key: value for key, value in (plain | extra).items() if value is not None}
    with pytest.raises(ValueError, match=f"^m.gguf: {message}"):
        read_config(Fields(arch, tensors, **fields))


def test_a_fused_tensor_of_another_size_than_the_metadata_says_is_refused(paths, monkeypatch):
    from dataclasses import replace

    from specdec.models import native

    read = native.read_config
    monkeypatch.setattr(native, "read_config", lambda file: replace(read(file), kv_heads=1))
    with pytest.raises(ValueError, match=r"phi3-target.gguf: blk.0.attn_qkv.weight has 512 rows, not q \+ k \+ v "
                                         r"rows = 384$"):
        NativeModel(paths["phi3"][0])
    monkeypatch.setattr(native, "read_config", lambda file: replace(read(file), ffn=256, kv_heads=2))
    with pytest.raises(ValueError, match=r"blk.0.ffn_up.weight has 1024 rows, not 2 × feed_forward_length"):
        NativeModel(paths["phi3"][0])
