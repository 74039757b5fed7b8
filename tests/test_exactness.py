"""Sequence-level exactness: whole speculative outputs against their exact probabilities.

Design. Target and draft are random bigram tables over a small vocabulary (V = 4), the draft a
mixture of the target and noise so that rounds end in every way (rejections at each position,
full acceptance with a bonus token). For each sampling setting we run ``speculative_generate``
34,000 times for each γ in {1, 2, 4} (102,000 runs in all, one seed per run, 5 new tokens after
a 2-token prompt: room for a full γ = 4 round and its bonus) and count every whole output
sequence. Its exact probability under the *adjusted* target (the sampling transform applied to
each table row) is a product of table entries, and it does not depend on γ. So each γ is tested
on its own and all three are tested pooled: a chi-square goodness-of-fit test (cells with
expected count < 5 pooled into one cell) must not reject at FALSE_ALARM = 10⁻³ per test. A
drafter that stops early on low confidence (γ then depends on the draft's own draws) gets the
same test. The thirteen tests together raise a false alarm with probability below 1.3% for a random seed; the
seeds here are fixed, so the outcome is reproducible. ``test_the_test_detects_a_biased_sampler``
shows the same test rejects a sampler that keeps every draft.

Per-position tests miss bugs that only show across rounds (an off-by-one in the rollback, a
stale cache row, a wrong row for the bonus token); sequence frequencies catch them.
"""

import itertools
import multiprocessing
import os

import numpy as np
import pytest
import torch
from conftest import random_table
from scipy import stats

from specdec import BigramModel, ModelDrafter, SamplingParams, probs_from_logits, speculative_generate

RUNS_PER_GAMMA = int(os.environ.get("SPECDEC_EXACTNESS_RUNS", 34_000))
GAMMAS = (1, 2, 4)
NEW_TOKENS = 5
FALSE_ALARM = 1e-3
VOCAB = 4
PROMPT = [2, 0]
STOP_BELOW = 0.5

SETTINGS = {
    "temperature-1": SamplingParams(temperature=1.0),
    "temperature-0.7-top-k-3": SamplingParams(temperature=0.7, top_k=3),
    "top-p-0.8": SamplingParams(top_p=0.8),
}


def models():
    rng = np.random.default_rng(42)
    target = random_table(rng, VOCAB, concentration=0.8)
    noise = random_table(rng, VOCAB, concentration=0.8)
    draft = 0.55 * target + 0.45 * noise
    return BigramModel(target), BigramModel(draft)


def exact_distribution(target: BigramModel, sampling: SamplingParams, length: int) -> dict:
    adjusted = probs_from_logits(target.log_probs, sampling).numpy()  # [V, V] rows: p after a token
    dist = {}
    for seq in itertools.product(range(VOCAB), repeat=length):
        prob, prev = 1.0, PROMPT[-1]
        for token in seq:
            prob *= adjusted[prev, token]
            prev = token
        if prob > 0:
            dist[seq] = prob
    return dist


def chi_square_pvalue(counts: dict, dist: dict, runs: int) -> float:
    assert set(counts) <= set(dist), f"impossible sequences produced: {set(counts) - set(dist)}"
    observed, expected, pooled_obs, pooled_exp = [], [], 0, 0.0
    for seq, prob in dist.items():
        if prob * runs >= 5:
            observed.append(counts.get(seq, 0))
            expected.append(prob * runs)
        else:
            pooled_obs += counts.get(seq, 0)
            pooled_exp += prob * runs
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    return stats.chisquare(observed, expected).pvalue


def _count_sequences(job: tuple) -> tuple[dict, int, int]:
    """Run one slice of the seeds for one (setting, γ); return sequence counts and rule usage."""
    setting, gamma, seeds, stop_below = job
    torch.set_num_threads(1)
    target, draft_model = models()
    draft = ModelDrafter(draft_model, stop_below=stop_below)
    counts: dict = {}
    accepted = drafted = 0
    for seed in seeds:
        gen = speculative_generate(
            target, draft, PROMPT, max_new_tokens=NEW_TOKENS, gamma=gamma, sampling=SETTINGS[setting], seed=seed
        )
        key = tuple(gen.tokens)
        counts[key] = counts.get(key, 0) + 1
        accepted += gen.stats.accepted
        drafted += gen.stats.drafted
    return counts, accepted, drafted


@pytest.fixture(scope="module")
def outcomes():
    """{(setting, γ): (counts, accepted, drafted)}, computed once, split over the CPU cores."""
    jobs = []
    for setting in SETTINGS:
        for gamma in GAMMAS:
            for half in (0, 1):  # two slices each, so both cores of a 2-core machine work
                jobs.append((setting, gamma, range(half, RUNS_PER_GAMMA, 2), None))
    for half in (0, 1):  # the early-stopping drafter (transformers' confidence threshold)
        jobs.append(("temperature-1", 4, range(half, RUNS_PER_GAMMA, 2), STOP_BELOW))
    workers = min(2, os.cpu_count() or 1)
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        results = pool.map(_count_sequences, jobs)
    merged: dict = {}
    for (setting, gamma, _, stop), (counts, accepted, drafted) in zip(jobs, results, strict=True):
        name = (setting, gamma) if stop is None else (setting, gamma, "stop")
        total, acc, dr = merged.get(name, ({}, 0, 0))
        for seq, n in counts.items():
            total[seq] = total.get(seq, 0) + n
        merged[name] = (total, acc + accepted, dr + drafted)
    return merged


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_speculative_sequences_have_the_target_distribution(outcomes, setting, gamma):
    counts, accepted, drafted = outcomes[(setting, gamma)]
    assert sum(counts.values()) == RUNS_PER_GAMMA
    assert 0.3 < accepted / drafted < 0.95, "the rule must be exercised both ways"
    dist = exact_distribution(models()[0], SETTINGS[setting], NEW_TOKENS)
    assert chi_square_pvalue(counts, dist, RUNS_PER_GAMMA) > FALSE_ALARM


def test_early_stopping_drafter_keeps_the_target_distribution(outcomes):
    """Drafting stops after a token the draft gave q < STOP_BELOW: γ varies with the draft's draws."""
    counts, accepted, drafted = outcomes[("temperature-1", 4, "stop")]
    full_gamma_drafted = outcomes[("temperature-1", 4)][2]
    assert drafted < 0.9 * full_gamma_drafted, "the threshold must actually shorten drafts"
    dist = exact_distribution(models()[0], SETTINGS["temperature-1"], NEW_TOKENS)
    assert chi_square_pvalue(counts, dist, RUNS_PER_GAMMA) > FALSE_ALARM


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_sequences_pooled_over_gamma_have_the_target_distribution(outcomes, setting):
    pooled: dict = {}
    for gamma in GAMMAS:
        for key, n in outcomes[(setting, gamma)][0].items():
            pooled[key] = pooled.get(key, 0) + n
    runs = RUNS_PER_GAMMA * len(GAMMAS)
    assert chi_square_pvalue(pooled, exact_distribution(models()[0], SETTINGS[setting], NEW_TOKENS), runs) > FALSE_ALARM


def test_the_test_detects_a_biased_sampler():
    """Power check: drafts accepted without the rule (always kept) must fail the same test."""
    sampling = SETTINGS["temperature-1"]
    target, draft = models()
    runs = 20_000
    counts: dict = {}
    g = torch.Generator().manual_seed(0)
    adjusted_draft = probs_from_logits(draft.log_probs, sampling)
    for _ in range(runs):
        prev, seq = PROMPT[-1], []
        for _ in range(NEW_TOKENS):  # the naive sampler: the draft's own tokens
            prev = int(torch.multinomial(adjusted_draft[prev], 1, generator=g))
            seq.append(prev)
        counts[tuple(seq)] = counts.get(tuple(seq), 0) + 1
    assert chi_square_pvalue(counts, exact_distribution(target, sampling, NEW_TOKENS), runs) < FALSE_ALARM
