"""Choosing γ per round: fixed, transformers' heuristic schedule, and the adaptive controller."""

import numpy as np
import pytest
import torch
from conftest import random_table, tiny_qwen

from specdec import (
    BigramModel,
    HFModel,
    SamplingParams,
    autoregressive_generate,
    session,
    speculative_generate,
    theory,
)
from specdec.choices import MAX_GAMMA, make_policy, parse_gamma
from specdec.cli import build_parser
from specdec.gamma import (
    AcceptanceEstimate,
    AdaptiveGamma,
    CostEstimate,
    FixedGamma,
    HeuristicGamma,
)
from specdec.models.toy import ToyPair
from specdec.stats import RoundRecord

GREEDY = SamplingParams(temperature=0.0)


def record(drafted: int, accepted: int, beta: float = 0.8) -> RoundRecord:
    """A round that drafted `drafted` tokens, accepted `accepted`, with β = `beta` on its path."""
    on_path = min(accepted + 1, drafted)
    return RoundRecord(tuple(range(drafted)), accepted, 0, "bonus" if accepted == drafted else "recovered",
                       (beta,) * on_path, drafted)


def run_rounds(policy, n, beta, target_seconds, draft_seconds_per_token=0.0):
    """Drive a policy for n rounds: every draft accepted with β = beta, costs from the given curve."""
    for _ in range(n):
        g = policy.choose()
        policy.observe(record(g, g, beta), draft_seconds_per_token * g, target_seconds(g + 1))
    return policy


# --------------------------------------------------------------------------- heuristic schedule


def test_heuristic_follows_transformers_schedule():
    policy = HeuristicGamma()
    assert policy.choose() == 20  # transformers' default num_assistant_tokens
    policy.observe(record(20, 20), 0, 0)  # fully accepted: +2
    assert policy.choose() == 22
    policy.observe(record(22, 5), 0, 0)  # a rejection: −1
    assert policy.choose() == 21
    policy.observe(record(0, 0), 0, 0)  # nothing drafted (the budget's last token): no change
    assert policy.choose() == 21
    assert policy.chosen == [20, 22, 21, 21]


def test_heuristic_never_drops_below_one_and_respects_its_cap():
    low = HeuristicGamma(start=2)
    for _ in range(5):
        low.observe(record(low.choose(), 0), 0, 0)
    assert low.choose() == 1
    capped = HeuristicGamma(start=3, max_gamma=4)
    for _ in range(3):
        capped.observe(record(capped.choose(), capped.gamma), 0, 0)
    assert capped.choose() == 4


def test_heuristic_counts_a_short_draft_as_fully_accepted():
    """transformers compares matches with the candidates actually drafted (a confidence stop drafts fewer)."""
    policy = HeuristicGamma(start=5)
    policy.observe(record(2, 2), 0, 0)
    assert policy.choose() == 7


# --------------------------------------------------------------------------- adaptive controller


def test_adaptive_drafts_long_when_every_draft_is_accepted_and_drafting_is_free():
    policy = run_rounds(AdaptiveGamma(max_gamma=10), 30, beta=1.0, target_seconds=lambda k: 0.1)
    assert policy.best_gamma() == 10


def test_adaptive_drafts_one_when_acceptance_is_low_and_drafting_expensive():
    policy = run_rounds(AdaptiveGamma(max_gamma=10), 30, beta=0.2, target_seconds=lambda k: 0.1,
                        draft_seconds_per_token=0.05)
    assert policy.best_gamma() == 1
    assert policy.chosen[-4:].count(1) >= 3


def test_adaptive_learns_a_steep_verification_cost_and_lowers_gamma():
    policy = run_rounds(AdaptiveGamma(max_gamma=12), 40, beta=0.85, target_seconds=lambda k: 0.1,
                        draft_seconds_per_token=0.002)
    flat = policy.best_gamma()
    assert flat >= 6
    run_rounds(policy, 80, beta=0.85, target_seconds=lambda k: 0.1 * k, draft_seconds_per_token=0.002)
    assert policy.best_gamma() <= 2 < flat
    curve = policy.costs.call_curve()
    assert curve(4) / curve(2) == pytest.approx(2.0, rel=0.25)


def test_adaptive_explores_the_neighbours_of_its_best_gamma():
    policy = run_rounds(AdaptiveGamma(max_gamma=10, explore_every=4, c=0.1, target_cost=lambda k: 1.0), 32,
                        beta=0.7, target_seconds=lambda k: 0.1)
    best = policy.best_gamma()
    assert 1 < best < 10
    assert {best - 1, best, best + 1} <= set(policy.chosen[-16:])
    assert sum(g == best for g in policy.chosen[-16:]) == 12  # three rounds in four at the best γ


@pytest.mark.parametrize("max_gamma", [1, 2, 5])
def test_adaptive_stays_within_one_and_max_gamma(max_gamma):
    rng = np.random.default_rng(3)
    policy = AdaptiveGamma(max_gamma=max_gamma, explore_every=2)
    for _ in range(60):
        g = policy.choose()
        assert 1 <= g <= max_gamma
        accepted = int(rng.integers(0, g + 1))
        policy.observe(record(g, accepted, float(rng.uniform(0, 1))), float(rng.uniform(0, 0.01)),
                       float(rng.uniform(0.01, 0.2)))


def test_per_position_acceptance_tracks_each_position():
    estimate = AcceptanceEstimate(prior_alpha=0.6, prior_weight=1.0, position_weight=1.0)
    for _ in range(200):
        estimate.observe((0.5, 1.0, 1.0))
    a = estimate.positional(4)
    assert a[0] == pytest.approx(0.5, abs=0.02)
    assert a[1] == pytest.approx(1.0, abs=0.02) and a[2] == pytest.approx(1.0, abs=0.02)
    assert a[3] == pytest.approx(estimate.alpha)  # never reached: the global α
    assert estimate.alpha == pytest.approx(2.5 / 3, abs=0.02)


def test_cost_estimate_fits_a_line_and_uses_the_prior_slope_with_one_point():
    costs = CostEstimate(prior_slope=0.25)
    costs.observe(3, 3, 0.03, 0.2)  # T(4) = 0.2 → T(1) = 0.2 / 1.75 under the prior slope
    assert costs.call_curve()(1) == pytest.approx(0.2 / 1.75)
    for k, t in ((2, 0.2), (4, 0.4), (6, 0.6)):
        for _ in range(20):
            costs.observe(k - 1, k - 1, 0.01 * (k - 1), t * 1.0)
    curve = costs.call_curve()
    assert curve(8) == pytest.approx(0.8, rel=0.15)  # extrapolated along the line
    assert costs.draft_seconds(curve(1)) == pytest.approx(0.01)


def test_adaptive_choices_repeat_for_the_same_rounds():
    def choices():
        policy = AdaptiveGamma(max_gamma=6, explore_every=3, c=0.2, target_cost=lambda k: 1 + 0.1 * k)
        for i in range(20):
            g = policy.choose()
            policy.observe(record(g, i % (g + 1), 0.3 + 0.03 * i), 0.0, 0.0)
        return policy.chosen

    assert choices() == choices()


def test_adaptive_with_fixed_costs_repeats_a_seeded_sampled_run():
    rng = np.random.default_rng(11)
    target, draft = BigramModel(random_table(rng, 10, 0.5)), BigramModel(random_table(rng, 10, 0.5))

    def run():
        policy = AdaptiveGamma(max_gamma=5, c=0.1, target_cost=lambda k: 1.0)
        gen = speculative_generate(target, draft, [3], max_new_tokens=40, gamma=policy, sampling=SamplingParams(),
                                   seed=5)
        return gen.tokens, policy.chosen

    assert run() == run()


def test_bad_adaptive_options_are_refused():
    with pytest.raises(ValueError, match="explore_every=1"):
        AdaptiveGamma(explore_every=1)
    with pytest.raises(ValueError, match="gamma=0"):
        AdaptiveGamma(max_gamma=0)
    with pytest.raises(ValueError, match="c must be finite"):
        AdaptiveGamma(c=-1.0)
    with pytest.raises(ValueError, match="no entry for k = 5"):
        AdaptiveGamma(max_gamma=4, target_cost=[0.0, 1.0, 1.1, 1.2, 1.3])


@pytest.mark.parametrize("positional", [False, True])
def test_adaptive_predictions_are_the_theory_formula(positional):
    policy = run_rounds(AdaptiveGamma(max_gamma=6, explore_every=2, positional=positional), 25, beta=0.75,
                        target_seconds=lambda k: 0.1 + 0.02 * k, draft_seconds_per_token=0.01)
    curve = policy.costs.call_curve()
    c = policy.costs.draft_seconds(curve(1)) / curve(1)
    if positional:
        acceptance = policy.acceptance.positional(6)
        expected = [theory.expected_speedup_by_position(acceptance, g, c, curve) for g in range(1, 7)]
    else:
        expected = [theory.expected_speedup_cost_curve(policy.acceptance.alpha, g, c, curve) for g in range(1, 7)]
    assert policy.predicted_speedups() == pytest.approx(expected)
    assert policy.best_gamma() == 1 + int(np.argmax(expected))


# --------------------------------------------------------------------------- greedy equality


@pytest.mark.parametrize("spec", ["auto", "heuristic"])
def test_greedy_with_a_policy_equals_plain_on_bigrams(spec):
    rng = np.random.default_rng(7)
    table = random_table(rng, 12, concentration=0.3)
    target, draft = BigramModel(table), BigramModel(0.6 * table + 0.4 * random_table(rng, 12, concentration=0.3))
    for prompt in ([0], [3, 5, 1]):
        plain = autoregressive_generate(target, prompt, max_new_tokens=60, sampling=GREEDY)
        policy = make_policy(spec)
        spec_gen = speculative_generate(target, draft, prompt, max_new_tokens=60, gamma=policy, sampling=GREEDY)
        assert spec_gen.tokens == plain.tokens
        assert len(set(policy.chosen)) > 1, "γ must vary for this test to mean anything"


def test_greedy_auto_equals_plain_on_a_transformer():
    draft = tiny_qwen(seed=0)  # the target's twin with a noisy head: it agrees with it now and then
    noise = torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with torch.no_grad():
        draft.lm_head.weight.add_(0.5 * noise)
    target, draft = HFModel(tiny_qwen(seed=0)), HFModel(draft)
    prompt = [5, 17, 42, 8, 60]
    plain = autoregressive_generate(target, prompt, max_new_tokens=40, sampling=GREEDY)
    policy = AdaptiveGamma(max_gamma=8, explore_every=2)
    spec = speculative_generate(target, draft, prompt, max_new_tokens=40, gamma=policy, sampling=GREEDY)
    assert spec.tokens == plain.tokens
    assert 0 < spec.stats.accepted < spec.stats.drafted
    assert len(set(spec.stats.gammas)) > 1


# --------------------------------------------------------------------------- make_policy, settings, CLI


@pytest.mark.parametrize("spec, kind, gamma", [(3, FixedGamma, 3), ("4", FixedGamma, 4), (" 7 ", FixedGamma, 7),
                                               ("auto", AdaptiveGamma, None), ("AUTO", AdaptiveGamma, None),
                                               ("heuristic", HeuristicGamma, 20)])
def test_make_policy_accepts_every_form(spec, kind, gamma):
    policy = make_policy(spec)
    assert isinstance(policy, kind)
    if gamma is not None:
        assert policy.choose() == gamma


def test_make_policy_returns_a_policy_as_it_is():
    policy = HeuristicGamma(start=3)
    assert make_policy(policy) is policy


@pytest.mark.parametrize("spec", [0, -2, "0", "fast", "", "3.5", 2.5, True, None, MAX_GAMMA + 1, str(MAX_GAMMA + 1)])
def test_make_policy_names_the_bad_value_and_the_accepted_forms(spec):
    accepted = r"must be an integer in \[1, 64\], 'auto' .* or 'heuristic'"
    with pytest.raises(ValueError, match=rf"gamma=.* is invalid: {accepted}"):
        make_policy(spec)


def test_parse_gamma_keeps_the_named_forms():
    assert parse_gamma("Heuristic") == "heuristic" and parse_gamma("12") == 12
    assert parse_gamma(MAX_GAMMA) == MAX_GAMMA and parse_gamma(f" {MAX_GAMMA} ") == MAX_GAMMA


def test_generate_cli_takes_auto_by_default_and_integers():
    parser = build_parser()
    assert parser.parse_args(["generate", "hi"]).gamma == "auto"
    assert parser.parse_args(["generate", "hi", "--gamma", "5"]).gamma == 5
    assert parser.parse_args(["generate", "hi", "--gamma", "heuristic"]).gamma == "heuristic"
    with pytest.raises(SystemExit):
        parser.parse_args(["generate", "hi", "--gamma", "many"])


def test_settings_validate_gamma_forms():
    session.RunSettings(gamma="auto").validate()
    session.RunSettings(gamma=2).validate()
    with pytest.raises(ValueError, match="gamma='sometimes' is invalid"):
        session.RunSettings(gamma="sometimes").validate()


def test_session_reports_the_gamma_it_used():
    toy = ToyPair()
    settings = session.RunSettings(gamma="auto", max_new_tokens=40, sampling=SamplingParams(temperature=1.0),
                                   seed=2, chat=False)
    result = session.run(toy, "the cat", settings, compare=True)
    data = result.as_json()
    stats = result.speculative.stats
    assert data["gamma"] == "auto"
    assert sum(data["gamma_histogram"].values()) == stats.rounds == len(data["gamma_chosen"])
    assert data["mean_gamma"] == pytest.approx(sum(stats.gammas) / stats.rounds)
    assert all(d <= c for d, c in zip(stats.gammas, result.gamma_chosen, strict=True))  # drafted ≤ chosen
    assert data["predicted_speedup"] == pytest.approx(
        theory.expected_speedup_over_rounds(stats.alpha, stats.gammas, data["cost_ratio_c"]))
    assert "γ drafted per round: mean" in result.report()


# --------------------------------------------------------------------------- theory for varying γ


def test_per_position_expected_tokens_reduce_to_eq_1():
    assert theory.expected_tokens_by_position([0.7] * 5, 5) == pytest.approx(theory.expected_tokens(0.7, 5))
    assert theory.expected_tokens_by_position([0.5, 1.0, 1.0], 3) == pytest.approx(1 + 0.5 * 3)
    assert theory.expected_speedup_by_position([0.8] * 4, 4, 0.1, lambda k: 1 + 0.2 * (k - 1)) == pytest.approx(
        theory.expected_speedup_cost_curve(0.8, 4, 0.1, lambda k: 1 + 0.2 * (k - 1)))
    with pytest.raises(ValueError, match="acceptance has 2 entries"):
        theory.expected_tokens_by_position([0.5, 0.5], 3)
    with pytest.raises(ValueError, match="a_2 must be in"):
        theory.expected_tokens_by_position([0.5, 1.5], 2)


def test_speedup_over_rounds_matches_thm_3_8_for_a_fixed_gamma():
    assert theory.expected_speedup_over_rounds(0.8, [3] * 7, 0.1) == pytest.approx(theory.expected_speedup(0.8, 3, 0.1))
    mixed = theory.expected_speedup_over_rounds(0.8, [1, 3], 0.1)
    expected = (theory.expected_tokens(0.8, 1) + theory.expected_tokens(0.8, 3)) / (1.1 + 1.3)
    assert mixed == pytest.approx(expected)
    with pytest.raises(ValueError, match="at least one round"):
        theory.expected_speedup_over_rounds(0.8, [], 0.1)


@pytest.mark.parametrize(("weight", "quick"), [(1.0, True), (4.0, False)])
def test_a_good_draft_is_trusted_within_a_few_rounds(weight, quick):
    """A 128-token answer is 30-40 rounds: rounds spent at γ 1-2 while α is learned are a large part of it. With
    the prior counting as one observation (the default), fully accepted greedy rounds (β 1) take γ from 1 to 6 in
    3 rounds; counted as four, in 10 (on the default pair: mean γ 2.0-2.3 and 0.87-0.89x a fixed γ 5,
    against 2.8-3.3 and 1.01-1.04x: docs/speed.md, 2026-12-06)."""
    policy = AdaptiveGamma(max_gamma=8, explore_every=64, c=0.3, target_cost=lambda k: 1 + 0.1 * (k - 1),
                           acceptance=AcceptanceEstimate(prior_weight=weight))
    run_rounds(policy, 12, beta=1.0, target_seconds=lambda k: 1.0)
    reached = next((i for i, g in enumerate(policy.chosen) if g >= 6), None)
    assert (reached is not None and reached < 5) is quick, policy.chosen
    assert AcceptanceEstimate().prior_weight == 1.0
