"""Stacked products (``NativeSettings.stack``, ``ops.cpp``'s ``LayerWeights.qkv`` / ``gate_up``): a layer's q, k
and v, and its gate and up, as one matrix of their rows each, one product call instead of three and two.

The kernels compute every output row by itself, so a model's logits must be the same bits with the stacks and
without: reading a prompt (the prompt-reading product), scoring 1 and 5 tokens, and several sequences in one call
(``score_many``), on tiny files of every family (Qwen2 with its biases, one layer's v of another type: that
layer unstacked; Llama, Qwen3, Gemma 3) and on the real default pair (the target as shipped, the draft
re-quantized: its matrices all Q4_0, every layer stacked).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from tiny_archs import ARCHS, write_tiny
from tiny_qwen2 import write_tiny_qwen2

from specdec.loading import defaults as zoo
from specdec.models.native import NativeModel, NativeSettings


def same_logits_both_ways(path: str, vocab: int, threads: int = 2) -> NativeModel:
    """Asserts the stacked model and the unstacked one give the same bits; returns the stacked one."""
    on, off = (NativeModel(path, NativeSettings(threads=threads, stack=stack)) for stack in (True, False))
    rng = np.random.default_rng(0)
    prompt, more = rng.integers(0, vocab, 40).tolist(), rng.integers(0, vocab, 6).tolist()
    results = []
    for model in (on, off):
        model.prefill(prompt)
        read = model.score(more[:1])  # after a prompt read by the prompt-reading product
        five = model.score(more[1:])
        first = model.state()
        model.prefill(prompt[:17])
        second = model.state()
        many, _ = model.score_many([first, second], [more[:3], more[3:]])
        results.append([read, five, *many])
    for a, b in zip(*results, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)
    assert on.layers[-1].qkv is not None or on.layers[-1].gate_up is not None  # the stacks were in use
    assert all(layer.qkv is None and layer.gate_up is None for layer in off.layers)
    return on


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("stacked")


def test_qwen2_stacked_equals_unstacked_bitwise(folder):
    from tiny_qwen2 import VOCAB

    model = same_logits_both_ways(write_tiny_qwen2(folder / "qwen2.gguf", seed=0), VOCAB)
    first, last = model.layers[0], model.layers[-1]
    assert first.qkv is None and first.v is not None  # its v is Q6_K, its q and k Q4_K: three calls
    assert last.qkv is not None and last.qkv.bias is not None  # one type: stacked, the biases with them
    c = model.config
    assert last.qkv.out_features == (c.heads + 2 * c.kv_heads) * c.head_dim == last.qkv.bias.numel()
    assert all(layer.gate_up is not None and layer.gate is None for layer in model.layers)


@pytest.mark.parametrize("arch", ARCHS)
def test_each_family_stacked_equals_unstacked_bitwise(folder, arch):
    from tiny_archs import VOCAB

    same_logits_both_ways(write_tiny(folder / f"{arch}.gguf", arch, seed=2), VOCAB)


@pytest.mark.slow
def test_the_default_pair_stacked_equals_unstacked_bitwise():
    if zoo.missing_packages(zoo.DEFAULT_TARGET) or zoo.missing_packages(zoo.DEFAULT_DRAFT):
        if os.environ.get("SPECDEC_REQUIRE_REAL"):
            raise RuntimeError("SPECDEC_REQUIRE_REAL is set but specdec[default-models] is not installed")
        pytest.skip("specdec[default-models] not installed")
    from specdec.loading.requantize import requantized

    target, draft = zoo.default_paths(progress=False)
    stacked = same_logits_both_ways(requantized(str(draft), progress=False), 151936)
    assert all(layer.qkv is not None and layer.gate_up is not None for layer in stacked.layers)  # all Q4_0
    same_logits_both_ways(str(target), 151936)
