"""Sequence-level exactness for the drafters beyond a small model: prompt lookup, an n-gram table,
the composite (prompt lookup, else the bigram draft model), and a draft whose output head is cut
to part of the vocabulary (``specdec.models.head.CutHead``: q is zero outside the kept tokens).

Same design as ``test_exactness.py`` (its target, prompt, exact sequence probabilities and pooled
chi-square test are imported): the V = 4 random bigram target, 5 new tokens after a 2-token prompt,
RUNS runs (one seed each) per (drafter, sampling setting, γ), for γ ∈ {1, 3} at temperature 1
and at temperature 0.7 with top-k 3. Each whole output sequence is counted and compared with its
exact probability under the adjusted target, per γ and pooled over both γ.

A short V = 4 text repeats n-grams all the time, so prompt lookup really proposes: some lookups
are accepted, some rejected, and some rounds find no match and draft nothing (a plain target
step); the tests assert all three happened, so a drafter that never drafted cannot pass. The
n-gram table (order 3, top 3 continuations per context) is fitted on a short sample of the draft
table, so it backs off to lower orders and its q has zeros. The cut-head draft is the bigram draft
written as one-hot(last token) → linear head of log-probabilities, with the real CutHead keeping
tokens {0, 1, 3}: token 2 is never drafted, and the rule must supply it at its target rate.

Twenty-four tests at FALSE_ALARM = 10⁻³ each: a false alarm with probability below 2.4% for a random
seed; the seeds are fixed, so the outcome is reproducible. ``test_the_test_detects_...`` shows the
same test, at the same run count, rejects prompt lookup that reports a uniform q for its guesses.
"""

import multiprocessing
import os

import numpy as np
import pytest
import torch
from test_exactness import (
    FALSE_ALARM,
    NEW_TOKENS,
    PROMPT,
    VOCAB,
    chi_square_pvalue,
    exact_distribution,
    models,
)

from specdec import ModelDrafter, SamplingParams, speculative_generate
from specdec.drafters import CompositeDrafter, Proposal
from specdec.drafters.lookup import PromptLookupDrafter
from specdec.models.bigram import BigramModel
from specdec.models.head import CutHead
from specdec.models.ngram import NgramModel

RUNS = int(os.environ.get("SPECDEC_EXACTNESS_RUNS", "5000"))
GAMMAS = (1, 3)
SETTINGS = {
    "temperature-1": SamplingParams(temperature=1.0),
    "temperature-0.7-top-k-3": SamplingParams(temperature=0.7, top_k=3),
}
DRAFTERS = ("lookup", "ngram", "lookup+model", "cut-head")
CUT_KEEP = (0, 1, 3)


def ngram_table() -> NgramModel:
    """Order 3 from 48 tokens sampled from the draft table: unseen contexts back off."""
    rng = np.random.default_rng(7)
    table = models()[1].probs.numpy()
    corpus = []
    for _ in range(4):
        seq = [int(rng.integers(VOCAB))]
        for _ in range(11):
            seq.append(int(rng.choice(VOCAB, p=table[seq[-1]])))
        corpus.append(seq)
    return NgramModel.fit(corpus, order=3, vocab_size=VOCAB, top_k=3, dtype=torch.float64)


class CutHeadBigram(BigramModel):
    """The bigram draft as a network: one-hot(last token) → a linear head whose weights are the
    table's log-probabilities, cut by ``CutHead`` to ``keep``."""

    def __init__(self, table: BigramModel, keep) -> None:
        super().__init__(table.probs.numpy())
        head = torch.nn.Linear(VOCAB, VOCAB, bias=False, dtype=torch.float64)
        with torch.no_grad():
            head.weight.copy_(table.log_probs.T.clamp(min=-1e30))  # [V out, V in]
        self.head = CutHead(head, torch.tensor(keep), VOCAB)

    def score(self, tokens):
        rows = super().score(tokens)  # keeps the cache bookkeeping; the head gives the logits
        one_hot = torch.nn.functional.one_hot(torch.tensor([int(t) for t in tokens]), VOCAB).to(torch.float64)
        with torch.no_grad():
            return self.head(one_hot).to(rows.dtype)  # [k, V], -inf outside keep


class MislabeledLookup(PromptLookupDrafter):
    """Prompt lookup that reports a uniform q for its guesses instead of the one-hot q it drew them
    from: the rule then keeps guesses too often, and the output is biased."""

    def propose(self, sequence, gamma, sampling, generator) -> Proposal:
        draft = super().propose(sequence, gamma, sampling, generator)
        return Proposal(draft.tokens, torch.full_like(draft.probs, 1.0 / VOCAB), calls=0)


def make(name: str):
    # min_ngram=1: these sequences are a few tokens long, so one-token matches keep the lookup busy
    # (the default, 2, would leave it mostly silent here; the rule's exactness holds for any n).
    if name == "mislabeled-lookup":
        return MislabeledLookup(VOCAB, dtype=torch.float64, min_ngram=1)
    if name == "lookup":
        return PromptLookupDrafter(VOCAB, dtype=torch.float64, min_ngram=1)
    if name == "ngram":
        return ModelDrafter(ngram_table())
    if name == "cut-head":
        return ModelDrafter(CutHeadBigram(models()[1], CUT_KEEP))
    return CompositeDrafter(PromptLookupDrafter(VOCAB, dtype=torch.float64, min_ngram=1), ModelDrafter(models()[1]))


def _count_sequences(job: tuple) -> tuple[dict, dict]:
    """One slice of seeds for one (drafter, setting, γ): sequence counts and how the rule was used."""
    name, setting, gamma, seeds = job
    torch.set_num_threads(1)
    target, drafter = models()[0], make(name)
    counts: dict = {}
    usage = {"drafted": 0, "accepted": 0, "rejected": 0, "empty": 0, "first": 0, "fallback": 0,
             "cut-drafted": 0, "cut-emitted": 0}
    for seed in seeds:
        gen = speculative_generate(target, drafter, PROMPT, max_new_tokens=NEW_TOKENS, gamma=gamma,
                                   sampling=SETTINGS[setting], seed=seed)
        key = tuple(gen.tokens)
        counts[key] = counts.get(key, 0) + 1
        cut = set(range(VOCAB)) - set(CUT_KEEP)
        usage["cut-emitted"] += sum(t in cut for t in gen.tokens)
        for record in gen.stats.records:
            usage["cut-drafted"] += sum(t in cut for t in record.drafted)
            usage["drafted"] += len(record.drafted)
            usage["accepted"] += record.n_accepted
            usage["rejected"] += record.n_accepted < len(record.drafted)
        # Rounds drafting nothing although γ ≥ 1 was asked: the final round of a run may get γ = 0
        # (the budget), so count only rounds that had room for a draft.
        room = [NEW_TOKENS - sum(len(r.tokens) for r in gen.stats.records[:i]) for i in range(len(gen.stats.records))]
        usage["empty"] += sum(1 for r, left in zip(gen.stats.records, room, strict=True) if not r.drafted and left > 1)
        for part, n in getattr(drafter, "rounds", {}).items():
            usage[part] += n
    return counts, usage


@pytest.fixture(scope="module")
def outcomes():
    """{(drafter, setting, γ): (counts, usage)}, computed once, split over the CPU cores."""
    jobs = [(name, setting, gamma, range(half, RUNS, 2))
            for name in DRAFTERS for setting in SETTINGS for gamma in GAMMAS for half in (0, 1)]
    jobs += [("mislabeled-lookup", "temperature-1", 3, range(half, RUNS, 2)) for half in (0, 1)]
    return run_jobs(_count_sequences, jobs)


def run_jobs(count, jobs: list[tuple]) -> dict:
    """``count`` over ``jobs`` ((name, setting, γ, seeds) each) on the CPU cores, each job's (sequence counts,
    usage) merged per (name, setting, γ)."""
    with multiprocessing.get_context("fork").Pool(min(2, os.cpu_count() or 1)) as pool:
        results = pool.map(count, jobs)
    merged: dict = {}
    for (name, setting, gamma, _), (counts, usage) in zip(jobs, results, strict=True):
        total, used = merged.setdefault((name, setting, gamma), ({}, dict.fromkeys(usage, 0)))
        for seq, n in counts.items():
            total[seq] = total.get(seq, 0) + n
        for key, n in usage.items():
            used[key] += n
    return merged


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name", DRAFTERS)
def test_drafter_sequences_have_the_target_distribution(outcomes, name, setting, gamma):
    counts, usage = outcomes[(name, setting, gamma)]
    assert sum(counts.values()) == RUNS
    assert usage["accepted"] > 0.05 * RUNS and usage["rejected"] > 0.05 * RUNS, f"rule not exercised: {usage}"
    if name == "lookup":  # some rounds found no match and drafted nothing
        assert usage["empty"] > 0.05 * RUNS, f"no empty drafts: {usage}"
    if name == "lookup+model":  # both parts of the composite drafted
        assert usage["first"] > 0.05 * RUNS and usage["fallback"] > 0.05 * RUNS, f"one part never drafted: {usage}"
    if name == "cut-head":  # the cut token was never drafted, yet it is in the output
        assert usage["cut-drafted"] == 0 and usage["cut-emitted"] > 0.05 * RUNS, f"cut token: {usage}"
    dist = exact_distribution(models()[0], SETTINGS[setting], NEW_TOKENS)
    assert chi_square_pvalue(counts, dist, RUNS) > FALSE_ALARM


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name", DRAFTERS)
def test_drafter_sequences_pooled_over_gamma_have_the_target_distribution(outcomes, name, setting):
    pooled: dict = {}
    for gamma in GAMMAS:
        for seq, n in outcomes[(name, setting, gamma)][0].items():
            pooled[seq] = pooled.get(seq, 0) + n
    dist = exact_distribution(models()[0], SETTINGS[setting], NEW_TOKENS)
    assert chi_square_pvalue(pooled, dist, RUNS * len(GAMMAS)) > FALSE_ALARM


def test_the_test_detects_a_lookup_drafter_with_a_wrong_q(outcomes):
    """Power check: the same test, at the same run count, rejects a drafter that misreports q."""
    counts, usage = outcomes[("mislabeled-lookup", "temperature-1", 3)]
    assert usage["drafted"] > 0.1 * RUNS
    dist = exact_distribution(models()[0], SETTINGS["temperature-1"], NEW_TOKENS)
    assert chi_square_pvalue(counts, dist, RUNS) < FALSE_ALARM
