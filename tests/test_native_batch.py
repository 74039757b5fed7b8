"""NativeModel.score_many (one forward pass over the rows of several sequences, ops_layers_many in ops.cpp) on a tiny
random Qwen2 GGUF: each sequence's logits and KV rows are bit for bit what scoring it alone gives, at contexts of
1..505 (across the KV cache's first capacity, 512) and 0..8 rows, with 1 and 2 threads, a cut head, the avx2 and
scalar builds; states outside the call and the model's own state are left alone."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tiny_qwen2 import VOCAB, write_tiny_qwen2

from specdec.cache import cache_dir
from specdec.models.native import NativeModel, NativeSettings
from specdec.native import kernels as ops

CONTEXTS = (1, 37, 300, 505, 12)
ROUNDS = ((3, 8, 1, 5, 0), (2, 4, 6, 7, 1))  # rows per sequence in two successive calls: 1..8, and none


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2-batch") / "target.gguf", seed=0)


def tokens(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, n)]


def read(model: NativeModel, contexts) -> list[tuple]:
    states = []
    for context in contexts:
        model.prefill(tokens(context, seed=context))
        states.append(model.state())
    return states


def kv_rows(state: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    cache, length = state
    return cache.keys[:, :length].clone(), cache.values[:, :length].clone()


def model_for(path: str, variant: str) -> NativeModel:
    if variant == "avx2" and "avx2" not in open("/proc/cpuinfo").read():
        pytest.skip("this CPU has no AVX2")
    isa = variant if variant in ("avx2", "scalar") else "native"
    model = NativeModel(path, NativeSettings(threads=1 if variant == "1 thread" else 2, isa=isa))
    if variant == "cut head":
        model.cut_head(range(0, VOCAB, 3))
    return model


@pytest.mark.parametrize("variant", ["2 threads", "1 thread", "cut head", "avx2", "scalar"])
def test_each_sequence_is_bitwise_what_it_gets_alone(tiny_path, variant):
    model = model_for(tiny_path, variant)
    batched = read(model, CONTEXTS)
    alone = [(copy.deepcopy(cache), length) for cache, length in batched]
    bystander, own = read(model, [40, 25])  # a sequence outside every call; the model's own
    before = kv_rows(bystander)
    for round_, rows in enumerate(ROUNDS):
        blocks = [tokens(k, seed=100 * round_ + s) for s, k in enumerate(rows)]
        logits, new_states = model.score_many(batched, blocks)
        assert [len(x) for x in logits] == list(rows) and all(x.shape[1] == VOCAB for x in logits)
        for s, (state, block) in enumerate(zip(alone, blocks, strict=True)):
            model.restore(state)
            want = model.score(block)
            alone[s] = model.state()
            assert torch.equal(logits[s], want), f"{variant}: sequence {s} (context {CONTEXTS[s]}), round {round_}"
            assert new_states[s][0] is batched[s][0] and new_states[s][1] == alone[s][1] == batched[s][1] + rows[s]
            for got, expected in zip(kv_rows(new_states[s]), kv_rows(alone[s]), strict=True):
                assert torch.equal(got, expected), f"{variant}: KV rows of sequence {s}, round {round_}"
        model.restore(own)
        batched = new_states
    assert model.state()[0] is own[0] and model.state()[1] == own[1]
    assert all(torch.equal(a, b) for a, b in zip(kv_rows(bystander), before, strict=True))
    if variant == "cut head":
        assert torch.isneginf(logits[1][:, 1]).all() and torch.isfinite(logits[1][:, 0]).all()


def test_one_sequence_and_empty_calls(tiny_path):
    model = model_for(tiny_path, "2 threads")
    (state,) = read(model, [20])
    twin = (copy.deepcopy(state[0]), state[1])
    (got,), (after,) = model.score_many([state], [[5, 6, 7]])
    model.restore(twin)
    assert torch.equal(got, model.score([5, 6, 7])) and after == (state[0], 23)
    logits, states = model.score_many([after, twin], [[], []])
    assert [tuple(x.shape) for x in logits] == [(0, VOCAB), (0, VOCAB)] and states == [after, twin]
    assert model.score_many([], []) == ([], [])


def test_bad_calls_are_refused(tiny_path):
    model = model_for(tiny_path, "2 threads")
    (state,) = read(model, [10])
    with pytest.raises(ValueError, match="one token list per state: 1 states, 2 token lists"):
        model.score_many([state], [[1], [2]])
    with pytest.raises(ValueError, match="share a KV cache"):
        model.score_many([state, state], [[1], [2]])
    with pytest.raises(ValueError, match="length must be >= 0, got -1"):
        model.score_many([(state[0], -1)], [[1]])
    logits, _ = model.score_many([state, state], [[1], []])  # a cache named twice but written once is fine
    assert logits[0].shape == (1, VOCAB)
    c, layer = model.config, model.layers[0]
    keys = torch.zeros(4, c.kv_heads, c.head_dim)  # room for 4 positions, not 3 + 2
    with pytest.raises(ValueError, match=r"sequence 0: its KV cache must be contiguous float32 \[>= 5"):
        ops.layer_many(layer.weights, model._shape, torch.zeros(2, c.hidden), [3], [2], [keys], [keys.clone()],
                       model._inv_freq, 1)
    with pytest.raises(ValueError, match="sum\\(rows\\) = 2 rows, got \\[3"):
        ops.layer_many(layer.weights, model._shape, torch.zeros(3, c.hidden), [0], [2], [keys], [keys.clone()],
                       model._inv_freq, 1)


def test_every_layer_in_one_call_is_each_layer_in_turn_bitwise(tiny_path):
    """``ops.layers_many`` (score_many's one call) against ``ops.layer_many`` per layer: the same x and KV bits, with
    caches of different capacities (a cache grown past 512 beside a fresh one)."""
    model = model_for(tiny_path, "2 threads")
    states = read(model, [505, 12])
    for cache, length in states:
        cache.writable(length, length + 8)
    assert states[0][0].keys.shape[1] != states[1][0].keys.shape[1]
    caches, starts, rows = [s[0] for s in states], [s[1] for s in states], [5, 3]
    twins = [copy.deepcopy(cache) for cache in caches]
    x0 = model._embed_rows(tokens(8, seed=1))
    one, each = x0.clone(), x0.clone()
    ops.layers_many(model._stack, model._shape, one, starts, rows, [c.keys for c in caches],
                    [c.values for c in caches], model._threads)
    for i, layer in enumerate(model.layers):
        ops.layer_many(layer.weights, model._shape, each, starts, rows, [c.keys[i] for c in twins],
                       [c.values[i] for c in twins], layer.inv_freq, model._threads)
    assert torch.equal(one, each) and not torch.equal(one, x0)
    for mine, theirs in zip(caches, twins, strict=True):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
    with pytest.raises(ValueError, match="whole KV cache, contiguous"):
        ops.layers_many(model._stack, model._shape, one, starts, rows, [c.keys[0] for c in caches],
                        [c.values[0] for c in caches], 1)


REAL_TARGET = cache_dir() / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


@pytest.mark.slow
@pytest.mark.skipif(not REAL_TARGET.is_file(), reason="the default target is not in the cache (scripts/setup.sh)")
def test_real_target_sequences_are_bitwise_what_they_get_alone():
    model = NativeModel(str(REAL_TARGET), NativeSettings(threads=2))
    states = []
    for context in (21, 290, 7):
        model.prefill([int(t) for t in np.random.default_rng(context).integers(0, 150000, context)])
        states.append(model.state())
    twins = [(copy.deepcopy(cache), length) for cache, length in states]
    blocks = [[int(t) for t in np.random.default_rng(s).integers(0, 150000, k)] for s, k in enumerate((1, 6, 3))]
    logits, _ = model.score_many(states, blocks)
    for got, twin, block in zip(logits, twins, blocks, strict=True):
        model.restore(twin)
        assert torch.equal(got, model.score(block))
