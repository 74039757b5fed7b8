"""Sequence-level exactness through the native backend: speculative sampling with a native target and
a native draft (tiny random GGUF files of each architecture: Qwen2, Llama, Qwen3, Gemma 3; 4-token vocabulary,
Q4_K/Q6_K/Q8_0/Q5_0 kernels) gives every 3-token continuation with the probability plain sampling from the
target gives it.

The exact distribution is computed from the target itself (its p after every prefix, each prefix read
fresh), so the test checks the whole path: kernels, batch invariance, the rule, the decode loop.
Chi-square over the 64 sequences at a false-alarm rate of 1e-3 per test (fixed seeds: deterministic).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from test_exactness import chi_square_pvalue
from tiny_archs import write_tiny
from tiny_qwen2 import write_tiny_qwen2

from specdec import ModelDrafter, SamplingParams, probs_from_logits, speculative_generate
from specdec.models.native import NativeModel, NativeSettings

VOCAB, NEW_TOKENS, RUNS, ALPHA = 4, 3, 3000, 1e-3
PROMPT = [1, 2, 0, 3, 1]
SETTINGS = {"temperature-1": SamplingParams(temperature=1.0), "top-p-0.9": SamplingParams(top_p=0.9)}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """arch → (target, draft), written when first asked for."""
    folder, made = tmp_path_factory.mktemp("tiny-v4"), {}

    def write(arch, name, seed):
        path = folder / f"{arch}-{name}.gguf"
        if arch == "qwen2":
            return write_tiny_qwen2(path, seed=seed, vocab=VOCAB, head_scale=0.2)
        return write_tiny(path, arch, seed=seed, vocab=VOCAB, head_scale=0.2)

    def pair(arch):
        if arch not in made:
            made[arch] = (NativeModel(write(arch, "t", 3), NativeSettings(1)),
                          NativeModel(write(arch, "d", 4), NativeSettings(1)))
        return made[arch]

    return pair


@pytest.fixture(scope="module")
def pair(pairs):
    return pairs("qwen2")


def exact_distribution(target: NativeModel, sampling: SamplingParams) -> dict:
    dist = {}
    for seq in itertools.product(range(VOCAB), repeat=NEW_TOKENS):
        prob, context = 1.0, list(PROMPT)
        for token in seq:
            target.prefill(context[:-1])
            p = probs_from_logits(target.score(context[-1:]), sampling)[0]
            prob *= float(p[token])
            context.append(token)
        if prob > 0:
            dist[seq] = prob
    total = sum(dist.values())  # 1 up to float32 rounding of p
    return {seq: prob / total for seq, prob in dist.items()}


def speculative_counts(target: NativeModel, draft: NativeModel, sampling: SamplingParams, gamma: int = 3):
    """How often speculative sampling gave each continuation over seeds 0..RUNS − 1, and its accepted and
    drafted totals: (counts, accepted, drafted)."""
    counts: dict = {}
    accepted = drafted = 0
    for seed in range(RUNS):
        gen = speculative_generate(target, ModelDrafter(draft), PROMPT, max_new_tokens=NEW_TOKENS, gamma=gamma,
                                   sampling=sampling, seed=seed)
        counts[tuple(gen.tokens)] = counts.get(tuple(gen.tokens), 0) + 1
        accepted, drafted = accepted + gen.stats.accepted, drafted + gen.stats.drafted
    return counts, accepted, drafted


@pytest.mark.parametrize("arch, setting, gamma", [("qwen2", "temperature-1", 1), ("qwen2", "temperature-1", 3),
                                                  ("qwen2", "top-p-0.9", 3), ("llama", "temperature-1", 3),
                                                  ("qwen3", "top-p-0.9", 3), ("gemma3", "temperature-1", 3)])
def test_native_speculative_sequences_have_the_target_distribution(pairs, arch, setting, gamma):
    target, draft = pairs(arch)
    sampling = SETTINGS[setting]
    dist = exact_distribution(target, sampling)
    assert sum(p * RUNS >= 5 for p in dist.values()) >= 30  # a spread-out target: the test has power
    counts, accepted, drafted = speculative_counts(target, draft, sampling, gamma)
    assert 0 < accepted < drafted  # the rule both kept and rejected drafts
    assert chi_square_pvalue(counts, dist, RUNS) > ALPHA


def test_the_test_detects_a_wrong_distribution(pair):
    """Power: sampling from the draft instead of the target is caught."""
    target, draft = pair
    sampling = SETTINGS["temperature-1"]
    dist = exact_distribution(target, sampling)
    counts: dict = {}
    gen = torch.Generator().manual_seed(0)
    for _ in range(RUNS):
        context = list(PROMPT)
        for _ in range(NEW_TOKENS):
            draft.prefill(context[:-1])
            q = probs_from_logits(draft.score(context[-1:]), sampling)[0]
            context.append(int(torch.multinomial(q, 1, generator=gen)))
        key = tuple(context[len(PROMPT):])
        counts[key] = counts.get(key, 0) + 1
    assert chi_square_pvalue(counts, dist, RUNS) < ALPHA
