"""Log-probabilities of the emitted tokens (``logprobs=k``), taken from the verification pass.

What they are: the target's raw distribution at each emitted token (the log-softmax of its logits, before the
sampling adjustments and any constraint's mask), for accepted, recovered and bonus tokens alike, with the k
most likely tokens there. Layers: a hand-built bigram target (known answers: the table's own log-probabilities);
the native backend, where speculative decoding gives the same tokens the same figures as plain decoding, bit for
bit; the limits refused.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tiny_qwen2 import VOCAB, write_tiny_qwen2

from specdec import ModelDrafter, SamplingParams, autoregressive_generate, speculative_generate
from specdec.models.bigram import BigramModel
from specdec.models.native import NativeModel, NativeSettings


def bigram(seed: int) -> BigramModel:
    return BigramModel(np.random.default_rng(seed).dirichlet(np.ones(6), size=6))


def test_a_bigram_target_s_logprobs_are_its_table():
    target, draft = bigram(0), bigram(1)
    gen = speculative_generate(target, ModelDrafter(draft), [2, 0], max_new_tokens=12, gamma=3,
                               sampling=SamplingParams(temperature=0.7, top_k=3), seed=4, logprobs=2)
    figures = [lp for r in gen.stats.records for lp in r.logprobs]
    kinds = {r.kind for r in gen.stats.records}
    assert [lp.token for lp in figures][: len(gen.tokens)] == gen.tokens and kinds == {"recovered", "bonus"}
    prev = 0
    for lp in figures[: len(gen.tokens)]:
        row = target.probs[prev].numpy()
        assert lp.logprob == pytest.approx(math.log(row[lp.token]), abs=1e-12)  # raw: not the tempered top-k p
        assert [t for t, _ in lp.top] == list(np.argsort(-row, kind="stable")[:2])
        assert lp.top[0][1] == pytest.approx(math.log(row.max()), abs=1e-12)
        prev = lp.token
    plain = autoregressive_generate(target, [2, 0], max_new_tokens=3, logprobs=0)
    assert all(r.logprobs[0].top == () for r in plain.stats.records)
    assert all(r.logprobs == () for r in speculative_generate(target, ModelDrafter(draft), [2, 0], max_new_tokens=4,
                                                               gamma=2).stats.records)


@pytest.fixture(scope="module")
def native_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("logprobs")
    path = write_tiny_qwen2(folder / "t.gguf", seed=0)  # the draft: the same file, so its drafts are accepted
    return NativeModel(path, NativeSettings(threads=2)), NativeModel(path, NativeSettings(threads=2))


@pytest.mark.parametrize("gamma", [1, 4])
def test_speculative_logprobs_equal_plain_decoding_bit_for_bit(native_pair, gamma):
    target, draft = native_pair
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, VOCAB, 40)]
    greedy = SamplingParams(temperature=0)
    plain = autoregressive_generate(target, prompt, max_new_tokens=24, sampling=greedy, logprobs=5)
    spec = speculative_generate(target, ModelDrafter(draft), prompt, max_new_tokens=24, gamma=gamma, sampling=greedy,
                                logprobs=5)
    assert spec.tokens == plain.tokens
    want = [lp for r in plain.stats.records for lp in r.logprobs]
    got = [lp for r in spec.stats.records for lp in r.logprobs][: len(spec.tokens)]
    assert got == want  # the same floats, bit for bit: each row its own log-softmax over the same logits
    assert any(r.n_accepted for r in spec.stats.records)  # accepted tokens' figures came from block rows


def test_logprobs_limits_are_refused():
    target, draft = bigram(0), bigram(1)
    for bad in (-1, 21, 2.5):
        with pytest.raises(ValueError, match="logprobs"):
            speculative_generate(target, ModelDrafter(draft), [1], max_new_tokens=2, gamma=1, logprobs=bad)
    assert torch.isfinite(torch.tensor([lp.logprob for r in autoregressive_generate(
        target, [1], max_new_tokens=3, logprobs=20).stats.records for lp in r.logprobs])).all()
