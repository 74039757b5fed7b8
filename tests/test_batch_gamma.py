"""The load-aware γ (specdec.server.engine.batch_gamma): a step priced with the batch's own cost curve."""

from __future__ import annotations

import pytest

from specdec import theory
from specdec.gamma import AdaptiveGamma
from specdec.server.engine.batch_gamma import Demand, SteeredGamma, assign, step_seconds, step_tokens


def roofline(rows: int) -> float:
    """A CPU target: one weight read (20 ms) serves up to 4 rows, then each row costs compute (8 ms)."""
    return 0.020 + 0.008 * max(rows - 4, 0)


def draft(rows: int) -> float:
    return 0.004 + 0.0005 * rows


def test_one_request_gets_the_best_gamma_of_thm_3_8_with_these_costs():
    demands = [Demand(alpha=0.8, max_gamma=16, model_drafted=True)]
    (gamma,) = assign(demands, roofline, draft)
    rates = {g: theory.expected_tokens(0.8, g) / step_seconds([g], demands, roofline, draft) for g in range(1, 17)}
    assert gamma == max(rates, key=rates.get)


def test_gamma_shrinks_as_the_batch_grows():
    chosen = {}
    for n in (1, 2, 4, 8):
        gammas = assign([Demand(0.8, 16, True)] * n, roofline, draft)
        chosen[n] = sum(gammas) / n
    assert chosen[1] > chosen[2] >= chosen[4] >= chosen[8]
    assert chosen[1] >= 3 and chosen[8] <= 1


def test_greedy_ascent_finds_the_optimum_of_small_cases():
    """Brute force over every γ vector of three requests (α differ) agrees with the greedy ascent."""
    demands = [Demand(0.9, 6, True), Demand(0.5, 6, True), Demand(0.7, 6, False)]
    best = max(((a, b, c) for a in range(7) for b in range(7) for c in range(7)),
               key=lambda g: step_tokens(list(g), demands) / step_seconds(list(g), demands, roofline, draft))
    got = assign(demands, roofline, draft)
    rate = step_tokens(got, demands) / step_seconds(got, demands, roofline, draft)
    optimum = step_tokens(list(best), demands) / step_seconds(list(best), demands, roofline, draft)
    assert rate == pytest.approx(optimum, rel=0.02)


def test_fixed_gammas_are_kept_and_priced():
    """A request with γ = 5 of its own pays the draft calls of positions 1..5 anyway: drafting beside
    it costs the free request less than alone, so it drafts more, the best γ given the fixed one's rows."""
    demands = [Demand(0.0, 5, True, chosen=5), Demand(0.8, 16, True)]
    gammas = assign(demands, roofline, draft)
    assert gammas[0] == 5
    rates = {g: step_tokens([5, g], demands) / step_seconds([5, g], demands, roofline, draft) for g in range(17)}
    assert gammas[1] == max(rates, key=rates.get)


def test_a_heavy_load_may_draft_nothing():
    """Eight requests on a target whose every row past the fourth costs 8 ms: verifying a draft costs
    more than the tokens it brings, so plain decoding's one row each is the best step."""
    assert assign([Demand(0.6, 16, True)] * 8, roofline, draft) == [0] * 8


def test_the_budget_caps_gamma():
    assert assign([Demand(0.95, 2, True)], lambda rows: 0.02, draft) == [2]


def test_a_steered_request_explores_one_more_every_eighth_round_but_from_nothing_only_at_first():
    """Assigned γ 2: every 8th round drafts 3 (α and the draft's cost stay measured). Assigned 0 (a heavy load):
    a job's first 4 rounds draft 1 while every round before drafted (its draft in step), then plain rounds
    only, since a draft that skipped tokens would read them all in an exploring round."""
    policy = SteeredGamma(AdaptiveGamma(max_gamma=6), explore_every=8, warmup=4)
    policy.assigned = 0
    assert [policy.choose() for _ in range(6)] == [1, 1, 1, 1, 0, 0]
    policy.assigned = 2
    assert [policy.choose() for _ in range(10)] == [2] + [3] + [2] * 7 + [3]  # rounds 8 and 16 of the job
    policy.assigned = 0
    assert [policy.choose() for _ in range(16)] == [0] * 16
    policy.assigned = 6  # the cap holds when exploring
    assert [policy.choose() for _ in range(8)] == [6] * 8
    joined_late = SteeredGamma(AdaptiveGamma(max_gamma=6), warmup=4)
    joined_late.assigned = 0
    joined_late.chosen = [2, 0]  # a round that drafted nothing: its draft is out of step from here on
    assert joined_late.choose() == 0
