"""The native backend's model (specdec.models.native) on tiny random Qwen2 GGUF files, and on the real
default target when it is in the cache.

Layers: the forward pass against transformers running the same de-quantized weights (an oracle for the
architecture: rotary style, grouped heads, biases); bitwise batch invariance through the whole model
(a token's logits alone = inside blocks of 2..16, at several context lengths, across the prompt-chunk
and KV-capacity boundaries); trim/state/restore; the cut head; greedy speculative = plain decoding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_qwen2 import VOCAB, transformers_twin, write_tiny_qwen2

from specdec import ModelDrafter, SamplingParams, autoregressive_generate, speculative_generate
from specdec.cache import cache_dir
from specdec.models.native import NativeModel, NativeSettings


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    return write_tiny_qwen2(folder / "target.gguf", seed=0), write_tiny_qwen2(folder / "draft.gguf", seed=1)


@pytest.fixture(scope="module")
def target(tiny_paths):
    return NativeModel(tiny_paths[0], NativeSettings(threads=2))


def tokens(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, n)]


def test_forward_matches_transformers_on_the_same_weights(tiny_paths, target):
    ids = tokens(48)
    target.prefill([])
    ours = target.score(ids)  # [48, vocab]
    with torch.no_grad():
        reference = transformers_twin(tiny_paths[0])(torch.tensor([ids])).logits[0]
    assert ours.shape == reference.shape == (48, VOCAB)
    assert reference.std() > 1.0  # a model whose logits say something
    # The kernels quantize activations to int8 per 256 weights (as llama.cpp does): ≈ 2% off, not more.
    assert float((ours - reference).norm() / reference.norm()) < 0.05
    assert float((ours.argmax(-1) == reference.argmax(-1)).float().mean()) >= 0.95


@pytest.mark.parametrize("context", [1, 37, 300, 505, 600])
def test_block_scores_equal_one_token_scores_bitwise(target, context):
    """505: blocks cross the KV cache's first capacity (512); 600: the prompt was read in two chunks."""
    prompt, block = tokens(context, seed=context), tokens(16, seed=context + 1)
    target.prefill(prompt)
    alone = []
    for t in block:
        alone.append(target.score([t])[0])
    alone = torch.stack(alone)  # [16, vocab]
    for k in (2, 3, 5, 8, 16):
        target.trim(context)
        got = target.score(block[:k])
        assert torch.equal(got, alone[:k]), f"context {context}, block of {k}: {float((got - alone[:k]).abs().max())}"
    # and in pieces after a longer detour (cache grown past the block, then trimmed back)
    target.trim(context)
    target.score(tokens(40, seed=7))
    target.trim(context)
    got = torch.cat([target.score(block[:5]), target.score(block[5:])])
    assert torch.equal(got, alone)


def test_state_restore_and_prefill_start_fresh(target):
    target.prefill(tokens(20, seed=3))
    saved = target.state()
    first = target.score([5, 6])
    target.prefill(tokens(9, seed=4))  # another sequence in between
    target.score([7])
    target.restore(saved)
    target.trim(20)
    assert torch.equal(target.score([5, 6]), first)
    with pytest.raises(ValueError, match="cannot trim to 99"):
        target.trim(99)


def test_cut_head_keeps_the_kept_logits_and_masks_the_rest(tiny_paths):
    full, cut = NativeModel(tiny_paths[1]), NativeModel(tiny_paths[1])
    keep = list(range(0, VOCAB, 3))
    cut.cut_head(keep)
    ids = tokens(12, seed=5)
    full.prefill(ids[:6])
    cut.prefill(ids[:6])
    a, b = full.score(ids[6:]), cut.score(ids[6:])
    mask = torch.zeros(VOCAB, dtype=torch.bool)
    mask[keep] = True
    assert torch.equal(a[:, mask], b[:, mask])
    assert torch.isneginf(b[:, ~mask]).all()
    with pytest.raises(ValueError, match="kept token ids"):
        cut.cut_head([VOCAB + 1])


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_speculative_equals_plain_decoding(tiny_paths, target, gamma):
    draft = NativeModel(tiny_paths[1], NativeSettings(threads=1))
    prompt = tokens(30, seed=gamma)
    greedy = SamplingParams(temperature=0.0)
    plain = autoregressive_generate(target, prompt, max_new_tokens=60, sampling=greedy)
    spec = speculative_generate(target, ModelDrafter(draft), prompt, max_new_tokens=60, gamma=gamma, sampling=greedy)
    assert spec.tokens == plain.tokens
    assert spec.stats.accepted < spec.stats.drafted  # a different draft: some drafts were rejected


def test_unsupported_architecture_is_refused_naming_the_supported_ones(tmp_path):
    from tiny_archs import write_other_arch

    path = write_other_arch(tmp_path / "mamba.gguf")
    with pytest.raises(ValueError, match=r"^mamba\.gguf: architecture 'mamba' is not supported by the native backend "
                                         r"\(supported: qwen2, llama, qwen3, gemma3, phi3, granite\); use --backend "
                                         r"transformers"):
        NativeModel(path)


REAL_TARGET = cache_dir() / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


@pytest.mark.slow
@pytest.mark.skipif(not REAL_TARGET.is_file(), reason="the default target is not in the cache (scripts/setup.sh)")
def test_real_target_block_scores_equal_one_token_scores_bitwise():
    model = NativeModel(str(REAL_TARGET))
    assert model.config.layers == 28 and model.vocab_size == 151936
    for context in (21, 290):
        prompt = [int(t) for t in np.random.default_rng(context).integers(0, 150000, context)]
        model.prefill(prompt)
        block = [int(t) for t in np.random.default_rng(context + 1).integers(0, 150000, 6)]
        alone = torch.stack([model.score([t])[0] for t in block])
        model.trim(context)
        assert torch.equal(model.score(block), alone)


def test_gguf_file_reads_the_tensors_and_metadata_gguf_reads(tiny_paths, tmp_path):
    from gguf import GGUFReader

    from specdec.native.gguf_file import GGUFFile

    ours, theirs = GGUFFile(tiny_paths[0]), GGUFReader(tiny_paths[0])
    assert ours.field("general.architecture") == "qwen2"
    assert ours.field("qwen2.block_count") == 2 and ours.field("tokenizer.ggml.eos_token_id") == VOCAB - 1
    assert len(ours.tensors) == len(theirs.tensors) > 20
    for tensor in theirs.tensors:
        mine = ours.tensors[tensor.name]
        assert mine.shape == tuple(int(d) for d in tensor.shape) and mine.qtype == tensor.tensor_type
        assert np.array_equal(mine.data.view(np.uint8).reshape(-1), np.asarray(tensor.data).view(np.uint8).reshape(-1))
    with pytest.raises(ValueError, match="metadata 'qwen2.nope' is missing"):
        ours.field("qwen2.nope")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFFile(str(bad))
    bad.write_bytes(b"GGUF" + bytes(16))
    with pytest.raises(ValueError, match="truncated or damaged GGUF file"):
        GGUFFile(str(bad))


def test_prompt_reading_product_agrees_with_scoring(tiny_paths, target):
    """Prompts are read with the prompt product (its own rounding); scoring them instead gives nearly the same
    KV cache: the next tokens' logits agree within the int8 activations' own noise (a rounding difference can
    move an activation to the next int8 step in a later layer; the twin test above allows 5%)."""
    other = NativeModel(tiny_paths[0], NativeSettings(threads=2, prompt_kernels=False))
    ids = tokens(110, seed=5)
    target.prefill(ids[:80])
    other.prefill(ids[:80])
    ours, scored = target.score(ids[80:]), other.score(ids[80:])  # [30, vocab]
    assert float((ours - scored).norm() / scored.norm()) < 0.02
    assert float((ours.argmax(-1) == scored.argmax(-1)).float().mean()) >= 0.8  # a random tiny model: near-ties


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
def test_every_instruction_set_gives_the_same_logits(tiny_paths, target, isa):
    if isa == "avx2" and "avx2" not in open("/proc/cpuinfo").read():
        pytest.skip("this CPU has no AVX2")
    other = NativeModel(tiny_paths[0], NativeSettings(threads=2, isa=isa))
    ids = tokens(40, seed=11)
    target.prefill(ids[:30])
    other.prefill(ids[:30])
    assert torch.equal(other.score(ids[30:]), target.score(ids[30:]))


def test_embedding_rows_equal_gguf_decoding(tiny_paths):
    from gguf import quants

    from specdec.native.gguf_file import GGUFFile
    from specdec.native.kernels import dequantize_rows

    embed = GGUFFile(tiny_paths[0]).tensors["token_embd.weight"]
    ids = np.array([0, 7, 7, VOCAB - 1])
    got = dequantize_rows(embed.data, embed.qtype, embed.shape[0], ids)
    want = quants.dequantize(np.ascontiguousarray(embed.data[ids]), embed.qtype)
    assert got.abs().sum() > 0 and np.array_equal(got.numpy(), want)


@pytest.mark.parametrize("mode", ["fast", "prompt"])
def test_every_layer_in_one_call_is_each_layer_in_turn_bitwise(target, mode):
    """``ops.layers`` (the forward pass's one call) against ``ops.layer`` per layer: the same x and KV cache bits."""
    from specdec.native import kernels as ops

    kind = ops.MODE_FAST if mode == "fast" else ops.MODE_PROMPT
    target.prefill([3, 1, 4, 1, 5, 9, 2, 6])
    cache, start = target._cache, target.length
    x0 = target._embed_rows([7, 8, 9])
    keys, values = cache.keys.clone(), cache.values.clone()
    one = x0.clone()
    ops.layers(target._stack, target._shape, one, start, cache.keys, cache.values, target._threads, "native", kind)
    each = x0.clone()
    for i, layer in enumerate(target.layers):
        ops.layer(layer.weights, target._shape, each, start, keys[i], values[i], layer.inv_freq, target._threads,
                  "native", kind)
    assert torch.equal(one, each) and not torch.equal(one, x0)
    assert torch.equal(cache.keys, keys) and torch.equal(cache.values, values)
    with pytest.raises(ValueError, match="KV cache of 2 layers"):
        ops.layers(target._stack, target._shape, one, start, cache.keys[:1], cache.values[:1], 1, "native", kind)
