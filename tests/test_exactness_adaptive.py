"""Sequence-level exactness when γ changes from round to round (``--gamma auto`` and the heuristic).

The same design as ``test_exactness.py`` (whose models, exact distribution and chi-square test
are imported): V = 4 random bigram tables, the draft a mixture of the target and noise, a
2-token prompt and 5 new tokens, RUNS = 14,000 whole outputs per test (one seed each) counted
against their exact probabilities under the adjusted target, small cells pooled, and the test
must not reject at FALSE_ALARM = 10⁻³. Three tests: the adaptive controller at two sampling settings and
transformers' heuristic schedule at one, so the file raises a false alarm with probability below
0.3% for a random seed; the seeds are fixed, so the outcome is reproducible.

The adaptive controller is given fixed costs (c and a flat T(k)) so that its choices depend only
on the β of past rounds (a timed controller would choose differently on every machine); its
prior α and c put the best γ near the switch between 1 and 2 drafts, so the first round's β
decides the second round's γ. Each test asserts that γ really varied with the past draws, so a
controller that always drafted the same γ could not pass it silently.
"""

import multiprocessing
import os

import pytest
import torch
from test_exactness import (
    FALSE_ALARM,
    NEW_TOKENS,
    PROMPT,
    SETTINGS,
    chi_square_pvalue,
    exact_distribution,
    models,
)

from specdec import ModelDrafter, speculative_generate
from specdec.gamma import AcceptanceEstimate, AdaptiveGamma, HeuristicGamma

RUNS = int(os.environ.get("SPECDEC_EXACTNESS_RUNS", 14_000))
CASES = {
    "adaptive/temperature-1": ("adaptive", "temperature-1"),
    "adaptive/top-p-0.8": ("adaptive", "top-p-0.8"),
    "heuristic/temperature-0.7-top-k-3": ("heuristic", "temperature-0.7-top-k-3"),
}


def make_controller(kind: str):
    if kind == "heuristic":
        return HeuristicGamma(start=2, max_gamma=4)
    acceptance = AcceptanceEstimate(prior_alpha=0.88, prior_weight=1.0, position_weight=1.0)
    return AdaptiveGamma(max_gamma=3, explore_every=3, c=0.7, target_cost=lambda k: 1.0, acceptance=acceptance)


def _count_sequences(job: tuple) -> tuple[dict, dict]:
    """One slice of the seeds for one case: sequence counts, and how often each 2nd-round γ was chosen."""
    case, seeds = job
    kind, setting = CASES[case]
    torch.set_num_threads(1)
    target, draft_model = models()
    drafter = ModelDrafter(draft_model)
    counts: dict = {}
    second: dict = {}
    for seed in seeds:
        controller = make_controller(kind)
        gen = speculative_generate(target, drafter, PROMPT, max_new_tokens=NEW_TOKENS, gamma=controller,
                                   sampling=SETTINGS[setting], seed=seed)
        key = tuple(gen.tokens)
        counts[key] = counts.get(key, 0) + 1
        if len(controller.chosen) > 1:
            second[controller.chosen[1]] = second.get(controller.chosen[1], 0) + 1
    return counts, second


@pytest.fixture(scope="module")
def outcomes():
    """{case: (sequence counts, {γ chosen in round 2: runs})}, split over the CPU cores."""
    jobs = [(case, range(half, RUNS, 2)) for case in CASES for half in (0, 1)]
    with multiprocessing.get_context("fork").Pool(min(2, os.cpu_count() or 1)) as pool:
        results = pool.map(_count_sequences, jobs)
    merged: dict = {}
    for (case, _), (counts, second) in zip(jobs, results, strict=True):
        total, seconds = merged.setdefault(case, ({}, {}))
        for key, n in counts.items():
            total[key] = total.get(key, 0) + n
        for g, n in second.items():
            seconds[g] = seconds.get(g, 0) + n
    return merged


@pytest.mark.parametrize("case", list(CASES))
def test_varying_gamma_keeps_the_target_distribution(outcomes, case):
    counts, second = outcomes[case]
    assert sum(counts.values()) == RUNS
    # γ must depend on the past draws: the second round's γ takes at least two values, each often.
    common = [g for g, n in second.items() if n >= 0.1 * RUNS]
    assert len(common) >= 2, f"the controller hardly varied γ: second-round choices {second}"
    dist = exact_distribution(models()[0], SETTINGS[CASES[case][1]], NEW_TOKENS)
    assert chi_square_pvalue(counts, dist, RUNS) > FALSE_ALARM
