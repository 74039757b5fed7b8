"""The paper's analysis (spec §3.1–3.5): Table 1, the worked examples, invariants, the plan CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from specdec.theory import (
    MAX_GAMMA_LIMIT,
    PlanRow,
    beta,
    d_lk,
    expected_arithmetic,
    expected_speedup,
    expected_speedup_cost_curve,
    expected_tokens,
    guaranteed_speedup,
    optimal_gamma,
    plan,
    speedup_bound,
)

# Table 1 of the paper (paper-tables.md): α, γ, operations, speed, at c = ĉ = 0.
TABLE_1 = [
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
]

ALPHAS = [0.0, 0.05, 0.2, 0.5, 0.62, 0.8, 0.9, 0.99]
COSTS = [0.0, 0.01, 0.05, 0.1, 0.3, 0.7, 1.0, 2.5]


@pytest.mark.parametrize("alpha, gamma, operations, speed", TABLE_1)
def test_table_1(alpha, gamma, operations, speed):
    assert round(expected_arithmetic(alpha, gamma, 0.0), 2) == operations
    assert round(expected_speedup(alpha, gamma, 0.0), 2) == speed
    assert round(expected_tokens(alpha, gamma), 2) == speed  # c = 0: speed-up is tokens per run


# --------------------------------------------------------------------------- worked examples


def test_worked_example_beta():
    p, q = [0.5, 0.3, 0.2], [0.6, 0.2, 0.2]  # target, draft (spec §2.3, §3.2)
    assert round(beta(p, q), 1) == 0.9
    assert isinstance(beta(p, q), float)
    assert d_lk(p, q) == pytest.approx(0.1)
    assert d_lk(p, q) == pytest.approx(1 - beta(p, q))
    assert beta(p, p) == pytest.approx(1.0)
    assert beta([1.0, 0.0], [0.0, 1.0]) == 0.0


def test_beta_batched_numpy_and_torch():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(50), size=4), rng.dirichlet(np.ones(50), size=4)
    b = beta(p, q)
    assert b.shape == (4,)
    expected = [sum(min(x, y) for x, y in zip(pi, qi, strict=True)) for pi, qi in zip(p, q, strict=True)]
    np.testing.assert_allclose(b, expected)
    np.testing.assert_allclose(d_lk(p, q), 1 - b)
    tb = beta(torch.tensor(p), torch.tensor(q))
    assert isinstance(tb, torch.Tensor) and tb.shape == (4,)
    np.testing.assert_allclose(tb.numpy(), b)
    mixed = beta(torch.tensor(p, dtype=torch.float32), q)  # a tensor and an array: a tensor
    assert isinstance(mixed, torch.Tensor) and mixed.dtype == torch.float32
    assert isinstance(d_lk(torch.tensor(p[0]), torch.tensor(q[0])), torch.Tensor)


def test_worked_example_tokens_speedup_arithmetic():
    alpha, gamma, c = 0.8, 5, 0.05
    tokens = expected_tokens(alpha, gamma)
    assert round(1 - (1 - alpha) * tokens, 3) == 0.262  # α^(γ+1)
    assert round(tokens, 2) == 3.69
    assert round(expected_speedup(alpha, gamma, c), 2) == 2.95
    assert round(expected_speedup(alpha, gamma, 0.0), 2) == 3.69  # a free draft
    assert round(expected_arithmetic(alpha, gamma, 0.0), 2) == 1.63


def test_bigram_draft_section_3_6():
    assert round(expected_speedup(0.2, 3, 0.0), 2) == 1.25


# --------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("c", COSTS)
def test_gamma_zero_is_ordinary_decoding(alpha, c):
    assert expected_tokens(alpha, 0) == 1.0
    assert expected_speedup(alpha, 0, c) == 1.0
    assert expected_arithmetic(alpha, 0, c) == 1.0


@pytest.mark.parametrize("alpha", ALPHAS)
def test_tokens_is_the_geometric_series_and_bounded(alpha):
    for gamma in range(0, 30):
        series = sum(alpha**i for i in range(gamma + 1))
        assert expected_tokens(alpha, gamma) == pytest.approx(series)
        assert expected_speedup(alpha, gamma, 0.0) <= speedup_bound(alpha) + 1e-12
    assert speedup_bound(alpha) == pytest.approx(1 / (1 - alpha))


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("c", COSTS)
def test_optimal_gamma_maximises_brute_force(alpha, c):
    for max_gamma in (1, 5, 12, 40):
        speeds = [expected_speedup(alpha, g, c) for g in range(1, max_gamma + 1)]
        best = optimal_gamma(alpha, c, max_gamma=max_gamma)
        assert 1 <= best <= max_gamma
        assert speeds[best - 1] >= max(speeds) * (1 - 1e-12)
        assert all(s < speeds[best - 1] * (1 + 1e-12) for s in speeds)  # nothing beats it
        rows = plan(alpha, c, max_gamma=max_gamma)
        assert [r.gamma for r in rows if r.best] == [best]


def test_optimal_gamma_known_cases_and_ties():
    assert optimal_gamma(0.8, 0.05, max_gamma=12) == 8
    assert optimal_gamma(0.0, 0.0, max_gamma=10) == 1  # all speed-ups equal 1: the smaller γ
    assert optimal_gamma(0.9, 0.0, max_gamma=17) == 17  # free draft: more γ always helps
    assert optimal_gamma(0.3, 0.5) == 1  # α ≤ c: γ = 1 loses least


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("c", COSTS)
def test_corollary_3_9(alpha, c):
    bound = guaranteed_speedup(alpha, c)
    if alpha > c:
        assert bound is not None and bound > 1
        assert bound <= expected_speedup(alpha, 1, c) + 1e-12
        assert max(r.speedup for r in plan(alpha, c)) > 1
    else:
        assert bound is None
        assert all(r.speedup <= 1 + 1e-12 for r in plan(alpha, c, max_gamma=30))


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("c", COSTS)
def test_flat_cost_curve_is_theorem_3_8(alpha, c):
    sequence = [None] + [1.0] * 20  # indexed by k: sequence[k] = T(k)
    mapping = {k: 3.0 for k in range(1, 20)}  # any unit: only T(γ+1)/T(1) counts
    for gamma in range(0, 15):
        want = expected_speedup(alpha, gamma, c)
        assert expected_speedup_cost_curve(alpha, gamma, c, lambda k: 1.0) == pytest.approx(want)
        assert expected_speedup_cost_curve(alpha, gamma, c, sequence) == pytest.approx(want)
        assert expected_speedup_cost_curve(alpha, gamma, c, mapping) == pytest.approx(want)
    assert optimal_gamma(alpha, c, 12, target_cost=lambda k: 1.0) == optimal_gamma(alpha, c, 12)


def test_rising_cost_curve():
    linear = lambda k: float(k)  # noqa: E731  (a target that is compute-bound: k tokens, k times)
    assert expected_speedup_cost_curve(0.8, 5, 0.0, linear) == pytest.approx(3.68928 / 6)
    # A target call that gets dearer with more tokens favours a shorter draft.
    steep = lambda k: 1.0 + 0.2 * (k - 1)  # noqa: E731
    assert optimal_gamma(0.8, 0.05, 12, target_cost=steep) < optimal_gamma(0.8, 0.05, 12)
    rows = plan(0.8, 0.05, target_cost=steep)
    best = next(r for r in rows if r.best)
    assert best.gamma == optimal_gamma(0.8, 0.05, 12, target_cost=steep)
    assert best.speedup == pytest.approx(expected_speedup_cost_curve(0.8, best.gamma, 0.05, steep))


def test_plan_rows():
    rows = plan(0.8, 0.05)
    assert [r.gamma for r in rows] == list(range(1, 13))
    assert sum(r.best for r in rows) == 1
    r5 = rows[4]
    assert r5 == PlanRow(5, expected_tokens(0.8, 5), expected_speedup(0.8, 5, 0.05),
                         expected_arithmetic(0.8, 5, 0.05), False)  # ĉ defaults to c
    assert plan(0.8, 0.05, c_hat=0.0)[4].arithmetic == pytest.approx(expected_arithmetic(0.8, 5, 0))
    with pytest.raises(AttributeError):
        r5.gamma = 3  # frozen


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    "call, shown, accepted",
    [
        (lambda: expected_tokens(1.0, 3), "1.0", "[0, 1)"),
        (lambda: expected_tokens(-0.1, 3), "-0.1", "[0, 1)"),
        (lambda: expected_speedup(float("nan"), 3, 0.1), "nan", "[0, 1)"),
        (lambda: expected_speedup(1.5, 3, 0.1), "1.5", "[0, 1)"),
        (lambda: expected_speedup(0.5, 3, -0.2), "-0.2", "≥ 0"),
        (lambda: expected_speedup(0.5, 3, math.inf), "inf", "≥ 0"),
        (lambda: expected_arithmetic(0.5, 3, -1), "-1", "≥ 0"),
        (lambda: expected_tokens(0.5, -1), "-1", ">= 0"),  # checks.check_int, the one integer message
        (lambda: expected_tokens(0.5, 2.5), "2.5", "integer"),
        (lambda: expected_tokens(0.5, True), "True", "integer"),
        (lambda: expected_tokens("0.5", 2), "'0.5'", "[0, 1)"),
        (lambda: guaranteed_speedup(2, 0.1), "2", "[0, 1)"),
        (lambda: speedup_bound(1), "1", "[0, 1)"),
        (lambda: optimal_gamma(0.5, 0.1, max_gamma=0), "0", f"[1, {MAX_GAMMA_LIMIT}]"),
        (lambda: plan(0.5, 0.1, max_gamma=10**6), "1000000", f"[1, {MAX_GAMMA_LIMIT}]"),
        (lambda: plan(0.5, 0.1, c_hat=-3), "-3", "≥ 0"),
        (lambda: plan(7, 0.1), "7", "[0, 1)"),
        (lambda: expected_speedup_cost_curve(0.5, 3, 0.1, [0, 1, 1]), "k = 4", "k = 1..γ+1"),
        (lambda: expected_speedup_cost_curve(0.5, 1, 0.1, lambda k: 0.0), "0.0", "> 0"),
        (lambda: beta([0.5, 0.5], [1.0]), "(2,)", "same shape"),
        (lambda: beta([1.5, -0.5], [0.5, 0.5]), "target_probs", "≥ 0"),
    ],
)
def test_bad_inputs_raise_value_error_naming_value_and_range(call, shown, accepted):
    with pytest.raises(ValueError) as err:
        call()
    assert shown in str(err.value) and accepted in str(err.value)


# --------------------------------------------------------------------------- the plan CLI


def _cli():
    from specdec import cli  # imports every sub-command module

    return cli


def test_cli_plan_table(capsys):
    cli = _cli()
    args = cli.build_parser().parse_args(["plan", "--alpha", "0.8", "--cost", "0.05"])
    assert args.run(args) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[-1] == "best γ = 8: 3.09× faster, 2.17× the arithmetic"
    starred = [line for line in lines if line.lstrip().startswith("*")]
    assert len(starred) == 1 and starred[0].split()[1] == "8"
    row5 = next(line for line in lines if line.split()[:1] == ["5"])
    assert "3.69" in row5 and "2.95×" in row5 and "1.69×" in row5  # ĉ = c = 0.05


def test_cli_plan_free_draft_matches_worked_example(capsys):
    cli = _cli()
    assert cli.main(["plan", "--alpha", "0.8", "--cost", "0", "--cost-ops", "0",
                     "--max-gamma", "5"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "best γ = 5: 3.69× faster, 1.63× the arithmetic"
    )


def test_cli_plan_run_with_namespace_json_and_plot(tmp_path, capsys):
    import argparse

    from specdec.cli import plan as plan_cmd

    png = tmp_path / "plan.png"
    ns = argparse.Namespace(alpha=0.8, cost=0.05, cost_ops=None, max_gamma=12, plot=str(png),
                            json=True, verify_slope=0.0)
    assert plan_cmd.run(ns) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["best_gamma"] == 8 and data["c_hat"] == 0.05 and len(data["rows"]) == 12
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]  # no temporary file left


def test_cli_plan_verify_slope_uses_the_cost_curve(tmp_path, capsys):
    cli = _cli()
    png = tmp_path / "curve.png"
    assert cli.main(["plan", "--alpha", "0.94", "--cost", "0.45", "--verify-slope", "0.3", "--json",
                     "--plot", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    curve = lambda k: 1.0 + 0.3 * (k - 1)  # noqa: E731
    assert data["verify_slope"] == 0.3
    assert data["rows"][2]["speedup"] == pytest.approx(expected_speedup_cost_curve(0.94, 3, 0.45, curve))
    assert data["best_gamma"] == optimal_gamma(0.94, 0.45, 12, target_cost=curve) == 2
    assert optimal_gamma(0.94, 0.45, 12) == 5  # the paper's T(k) = T(1) would draft more
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["plan", "--alpha", "0.8", "--cost", "0.05", "--verify-slope", "-1"]) == 2
    assert "-1" in capsys.readouterr().err


def test_cli_plan_errors(tmp_path, capsys):
    cli = _cli()
    assert cli.main(["plan", "--alpha", "1.2", "--cost", "0.05"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1.2" in err and "[0, 1)" in err
    assert cli.main(["plan", "--alpha", "0.8", "--cost", "-0.5"]) == 2
    err = capsys.readouterr().err
    assert "-0.5" in err and "≥ 0" in err
    missing = tmp_path / "no-such-folder" / "plan.png"
    assert cli.main(["plan", "--alpha", "0.8", "--cost", "0.05", "--plot", str(missing)]) == 2
    assert "no-such-folder" in capsys.readouterr().err


def test_cli_plan_help_lists_every_option(capsys):
    cli = _cli()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["plan", "--help"])
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for option in ("--alpha", "--cost", "--cost-ops", "--max-gamma", "--plot", "--json"):
        assert option in out
    assert "default: 12" in out and "default: the same as --cost" in out


def test_plot_plan_rejects_an_empty_plan(tmp_path):
    from specdec.analysis.plots import plot_plan

    with pytest.raises(ValueError, match="empty"):
        plot_plan([], 0.8, 0.05, tmp_path / "x.png")
    assert not any(tmp_path.iterdir())

