"""Round records → α, tokens per target call, mean γ: one place (stats.RoundTotals), pooled over runs."""

import pytest

from specdec.bench.figures import RunFigures
from specdec.bench.stats import RunRecord, pool_runs
from specdec.stats import GenerationStats, RoundRecord, RoundTotals, Timer, summarize

# Run A: γ = 3 with 2 accepted, then γ = 1 with all accepted (β at 3 + 1 positions, sum 2.5: α = 0.625).
RUN_A = [RoundRecord((1, 2, 3), 2, 4, "recovered", betas=(0.5, 1.0, 0.25)),
         RoundRecord((5,), 1, 6, "bonus", betas=(0.75,))]
# Run B: γ = 2, the first draft rejected (β at 1 position: α = 0.25).
RUN_B = [RoundRecord((7, 8), 0, 9, "recovered", betas=(0.25,))]


def test_totals_of_one_run():
    a = RoundTotals.of(RUN_A)
    assert (a.rounds, a.target_calls, a.drafted, a.accepted, a.new_tokens, a.verified) == (2, 2, 4, 3, 5, 4)
    assert a.alpha == 0.625 and a.acceptance_rate == 0.75 and a.mean_gamma == 2.0 and a.tokens_per_target_call == 2.5
    assert RoundTotals.of(RUN_A, new_tokens=4).tokens_per_target_call == 2.0  # cut at EOS or the budget


def test_pooled_alpha_weights_each_run_by_its_verified_positions():
    expected = (4 * 0.625 + 1 * 0.25) / 5  # 0.55, not the mean of the two α (0.4375)
    pooled = RoundTotals.pool([RoundTotals.of(RUN_A), RoundTotals.of(RUN_B)])
    assert pooled.alpha == pytest.approx(expected) == RoundTotals.of(RUN_A + RUN_B).alpha
    assert (pooled.rounds, pooled.drafted, pooled.accepted, pooled.new_tokens) == (3, 6, 3, 6)
    assert pooled.mean_gamma == 2.0 and pooled.acceptance_rate == 0.5 and pooled.tokens_per_target_call == 2.0

    a, b = summarize(RUN_A, 5, 4, Timer()), summarize(RUN_B, 1, 2, Timer())
    assert a.alpha == 0.625 and b.alpha == 0.25
    stats = GenerationStats.pool([a, b])
    assert stats.alpha == pytest.approx(expected) and stats.mean_gamma == 2.0 and stats.tokens_per_target_call == 2.0


def test_bench_pools_run_figures_the_same_way():
    def run(figures, n_tokens):
        return RunRecord(0.0, 0, "code-writing", "p", "spec", "transformers", 0, 3, tuple(range(n_tokens)), figures)

    runs = [run(RunFigures(1.0, 2, rounds=2, drafted=4, accepted=3, alpha=0.625, verified=4), 5),
            run(RunFigures(1.0, 1, rounds=1, drafted=2, accepted=0, alpha=0.25, verified=1), 1),
            run(RunFigures(1.0, 3), 3)]  # plain decoding: no α, no rounds
    pooled = pool_runs(runs)
    assert pooled.alpha == pytest.approx(0.55) and pooled.mean_gamma == 2.0
    assert pooled.tokens_per_target_call == 9 / 6
    assert pool_runs(runs + [run(RunFigures(1.0, None), 2)]).tokens_per_target_call is None  # calls unknown


def test_nothing_drafted_has_no_alpha():
    plain = RoundTotals.of([RoundRecord((), 0, 3, "bonus"), RoundRecord((), 0, 4, "bonus")])
    assert plain.alpha is None and plain.acceptance_rate is None and plain.mean_gamma == 0.0
    empty = RoundTotals.of([])
    assert empty.alpha is None and empty.mean_gamma is None and empty.tokens_per_target_call is None
