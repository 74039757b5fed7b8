"""Sequence-level exactness of the history drafter, alone and chained (history, else prompt lookup, else the
bigram draft model), with its table fed as the server feeds it.

Same design as ``test_exactness.py`` and ``test_exactness_drafters.py`` (their target, prompt, exact sequence
probabilities, pooled chi-square test and job runner are imported): the V = 4 random bigram target, 5 new
tokens after a 2-token prompt, RUNS runs (one seed each) per (drafter, sampling setting, γ), for γ ∈ {1, 3}
at temperature 1 and at temperature 0.7 with top-k 3. Each whole output sequence is counted and compared
with its exact probability under the adjusted target, per γ and pooled over both γ.

The table starts with four texts sampled from the draft table and, as in the server, every finished run's
text (prompt and output) is recorded into it, so later runs draft from earlier ones' outputs (the table
changes between runs; each run's output is still exactly the target's given whatever the table holds, so
the runs stay independent draws of it). ``min_match`` is 2 here: these texts are short, and a 4-token
alphabet repeats 2-grams all the time, so the drafter really proposes, from the request and from the table;
``min_prob`` is 0.5, so a continuation the table's texts disagree on is not drafted and the chain's fallbacks
draft too. The tests assert both places drafted, that guesses were accepted and rejected, and (for the chain)
that the draft model drafted. A small ``BUDGET`` makes eviction happen all along the runs.

Twelve tests at FALSE_ALARM = 10⁻³ each: a false alarm with probability below 1.2% for a random seed; the
seeds are fixed, so the outcome is reproducible. ``test_the_test_detects_...`` shows the same test, at the
same run count, rejects a history drafter that reports a uniform q for its guesses.
"""

import os

import numpy as np
import pytest
import torch
from test_exactness import FALSE_ALARM, NEW_TOKENS, PROMPT, VOCAB, chi_square_pvalue, exact_distribution, models
from test_exactness_drafters import run_jobs

from specdec import ModelDrafter, SamplingParams, speculative_generate
from specdec.drafters import CompositeDrafter, HistoryDrafter, HistorySettings, HistoryTable, Proposal
from specdec.drafters.lookup import PromptLookupDrafter

RUNS = int(os.environ.get("SPECDEC_EXACTNESS_RUNS", "5000"))
GAMMAS = (1, 3)
SETTINGS = {
    "temperature-1": SamplingParams(temperature=1.0),
    "temperature-0.7-top-k-3": SamplingParams(temperature=0.7, top_k=3),
}
DRAFTERS = ("history", "history+lookup+model")
HISTORY = HistorySettings(min_match=2, min_prob=0.5)
BUDGET = 200  # tokens: about 28 runs' texts, so eviction runs all along


class MislabeledHistory(HistoryDrafter):
    """The history drafter reporting a uniform q for its guesses instead of the one-hot q they came from."""

    def propose(self, sequence, gamma, sampling, generator, allowed=None) -> Proposal:
        draft = super().propose(sequence, gamma, sampling, generator)
        return Proposal(draft.tokens, torch.full_like(draft.probs, 1.0 / VOCAB), calls=0)


def starting_table() -> HistoryTable:
    """Four texts of 12 tokens sampled from the draft table."""
    rng = np.random.default_rng(7)
    table, probs = HistoryTable(VOCAB, BUDGET, settings=HISTORY), models()[1].probs.numpy()
    for _ in range(4):
        seq = [int(rng.integers(VOCAB))]
        for _ in range(11):
            seq.append(int(rng.choice(VOCAB, p=probs[seq[-1]])))
        table.record("", seq)
    return table


def make(name: str, table: HistoryTable):
    kind = MislabeledHistory if name == "mislabeled-history" else HistoryDrafter
    history = kind(VOCAB, table.view(), settings=HISTORY, dtype=torch.float64)
    if name != "history+lookup+model":
        return history
    rest = CompositeDrafter(PromptLookupDrafter(VOCAB, dtype=torch.float64, min_ngram=1), ModelDrafter(models()[1]))
    return CompositeDrafter(history, rest)


def _count_sequences(job: tuple) -> tuple[dict, dict]:
    """One slice of seeds for one (drafter, setting, γ): sequence counts and how the rule was used."""
    name, setting, gamma, seeds = job
    torch.set_num_threads(1)
    target, table = models()[0], starting_table()
    drafter = make(name, table)
    history = drafter.first if isinstance(drafter, CompositeDrafter) else drafter
    counts: dict = {}
    usage = {"drafted": 0, "accepted": 0, "rejected": 0, "request": 0, "history": 0, "lookup": 0, "model": 0,
             "evicted": 0}
    for seed in seeds:
        gen = speculative_generate(target, drafter, PROMPT, max_new_tokens=NEW_TOKENS, gamma=gamma,
                                   sampling=SETTINGS[setting], seed=seed)
        key = tuple(gen.tokens)
        counts[key] = counts.get(key, 0) + 1
        for record in gen.stats.records:
            usage["drafted"] += len(record.drafted)
            usage["accepted"] += record.n_accepted
            usage["rejected"] += record.n_accepted < len(record.drafted)
        if isinstance(drafter, CompositeDrafter):  # its rounds count one run (begin resets them)
            usage["lookup"] += drafter.fallback.rounds["first"]
            usage["model"] += drafter.fallback.rounds["fallback"]
        before = table.documents + 1
        table.record("", PROMPT + gen.tokens)  # as the server does when a request finishes
        usage["evicted"] += before - table.documents
    usage["request"], usage["history"] = history.sources["request"], history.sources["history"]
    return counts, usage


@pytest.fixture(scope="module")
def outcomes():
    """{(drafter, setting, γ): (counts, usage)}, computed once, split over the CPU cores."""
    jobs = [(name, setting, gamma, range(half, RUNS, 2))
            for name in DRAFTERS for setting in SETTINGS for gamma in GAMMAS for half in (0, 1)]
    jobs += [("mislabeled-history", "temperature-1", 3, range(half, RUNS, 2)) for half in (0, 1)]
    return run_jobs(_count_sequences, jobs)


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name", DRAFTERS)
def test_history_sequences_have_the_target_distribution(outcomes, name, setting, gamma):
    counts, usage = outcomes[(name, setting, gamma)]
    assert sum(counts.values()) == RUNS
    assert usage["accepted"] > 0.05 * RUNS and usage["rejected"] > 0.05 * RUNS, f"rule not exercised: {usage}"
    # Both places drafted (the request's own text rarely beats the table's in 7 tokens, yet it does).
    assert usage["history"] > 0.05 * RUNS and usage["request"] > 0.005 * RUNS, f"a place never drafted: {usage}"
    assert usage["evicted"] > 0.5 * RUNS, f"the table never evicted: {usage}"
    if name == "history+lookup+model":  # the fallbacks drafted too (the model when nothing matched)
        assert usage["model"] > 0.01 * RUNS, f"the chain's end never drafted: {usage}"
    dist = exact_distribution(models()[0], SETTINGS[setting], NEW_TOKENS)
    assert chi_square_pvalue(counts, dist, RUNS) > FALSE_ALARM


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name", DRAFTERS)
def test_history_sequences_pooled_over_gamma_have_the_target_distribution(outcomes, name, setting):
    pooled: dict = {}
    for gamma in GAMMAS:
        for seq, n in outcomes[(name, setting, gamma)][0].items():
            pooled[seq] = pooled.get(seq, 0) + n
    dist = exact_distribution(models()[0], SETTINGS[setting], NEW_TOKENS)
    assert chi_square_pvalue(pooled, dist, RUNS * len(GAMMAS)) > FALSE_ALARM


def test_the_test_detects_a_history_drafter_with_a_wrong_q(outcomes):
    """Power check: the same test, at the same run count, rejects a history drafter that misreports q."""
    counts, usage = outcomes[("mislabeled-history", "temperature-1", 3)]
    assert usage["drafted"] > 0.1 * RUNS
    dist = exact_distribution(models()[0], SETTINGS["temperature-1"], NEW_TOKENS)
    assert chi_square_pvalue(counts, dist, RUNS) < FALSE_ALARM
