"""The acceptance rule on hand-built probabilities: known answers, the identity, statistics."""

import numpy as np
import pytest
import torch
from scipy import stats

from specdec.rule import BONUS, RECOVERED, acceptance_overlap, count_accepted, residual_probs, sample, verify

# The spec's worked example: cat, dog, fish.
P = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
Q = torch.tensor([0.6, 0.2, 0.2], dtype=torch.float64)
CAT, DOG, FISH = 0, 1, 2
FALSE_ALARM = 1e-3  # per statistical test: a correct rule fails one with this chance for a random seed


def one_round(draft_token, p=P, q=Q, seed=0):
    """γ = 1: the draft proposed `draft_token` from q; the target's two rows are p and p."""
    g = torch.Generator().manual_seed(seed)
    return verify(torch.tensor([draft_token]), q[None], torch.stack([p, p]), g)


def test_worked_example_numbers():
    keep_cat = min(1.0, float(P[CAT] / Q[CAT]))
    assert round(keep_cat, 3) == 0.833
    rejected = float(sum(Q[x] * (1 - min(1.0, float(P[x] / Q[x]))) for x in range(3)))
    assert round(rejected, 1) == 0.1
    assert residual_probs(P, Q).tolist() == pytest.approx([0.0, 1.0, 0.0])  # p′ = dog
    assert float(acceptance_overlap(P, Q)) == pytest.approx(0.9)  # β


def test_worked_example_rule_behaviour():
    # "dog" and "fish" (q ≤ p) are always kept; a rejected "cat" is always replaced by "dog".
    for seed in range(200):
        for token in (DOG, FISH):
            verdict = one_round(token, seed=seed)
            assert verdict.n_accepted == 1 and verdict.kind == BONUS
        verdict = one_round(CAT, seed=seed)
        if verdict.kind == RECOVERED:
            assert verdict.n_accepted == 0 and verdict.next_token == DOG


def test_keep_probability_of_cat_is_five_sixths():
    n = 20_000
    g = torch.Generator().manual_seed(7)
    kept = sum(count_accepted(torch.tensor([CAT]), Q[None], P[None], g) for _ in range(n))
    assert stats.binomtest(kept, n, 5 / 6).pvalue > FALSE_ALARM


def random_pair(rng, vocab, kind):
    p = rng.dirichlet(np.ones(vocab))
    q = rng.dirichlet(np.ones(vocab))
    if kind == "zeros":
        p[rng.choice(vocab, vocab // 3, replace=False)] = 0
        q[rng.choice(vocab, vocab // 3, replace=False)] = 0
    elif kind == "disjoint":
        half = vocab // 2
        p[half:] = 0
        q[:half] = 0
    elif kind == "equal":
        q = p.copy()
    elif kind == "one-hot":
        p = np.eye(vocab)[rng.integers(vocab)]
        q = np.eye(vocab)[rng.integers(vocab)]
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("seed, kind", list(enumerate(["dense", "zeros", "disjoint", "equal", "one-hot"])))
def test_identity_draft_kept_plus_recovered_equals_target(seed, kind):
    # q(x)·min(1, p(x)/q(x)) + (1 − Σ min(p, q))·p′(x) = p(x)
    rng = np.random.default_rng(seed)
    for _ in range(200):
        vocab = int(rng.integers(2, 12))
        p_np, q_np = random_pair(rng, vocab, kind)
        p, q = torch.tensor(p_np), torch.tensor(q_np)
        keep = torch.where(q > 0, torch.clamp(p / torch.where(q > 0, q, 1), max=1), torch.zeros_like(q))
        beta = acceptance_overlap(p, q)
        reconstructed = q * keep + (1 - beta) * residual_probs(p, q)
        assert torch.allclose(reconstructed, p, atol=1e-12)
        assert torch.isclose(beta, 1 - 0.5 * (p - q).abs().sum())


def test_zero_q_at_drafted_token_is_accepted_iff_p_positive():
    g = torch.Generator().manual_seed(0)
    q = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    assert count_accepted(torch.tensor([0]), q, torch.tensor([[0.5, 0.5]], dtype=torch.float64), g) == 1
    assert count_accepted(torch.tensor([0]), q, torch.tensor([[0.0, 1.0]], dtype=torch.float64), g) == 0


def test_residual_with_no_mass_falls_back_to_target():
    p = torch.tensor([0.25, 0.75])
    assert residual_probs(p, p.clone()).tolist() == p.tolist()
    assert residual_probs(p, p + 1e-9).tolist() == p.tolist()


def test_sample_never_draws_zero_probability_tokens():
    g = torch.Generator().manual_seed(3)
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])
    draws = {sample(probs, g) for _ in range(2000)}
    assert draws == {1, 3}


def test_round_replays_exactly_from_the_same_generator_state():
    rng = np.random.default_rng(5)
    q = torch.tensor(rng.dirichlet(np.ones(6), size=4))
    p = torch.tensor(rng.dirichlet(np.ones(6), size=5))
    tokens = torch.tensor([0, 1, 2, 3])
    g = torch.Generator().manual_seed(11)
    state = g.get_state()
    first = [verify(tokens, q, p, g) for _ in range(50)]
    g.set_state(state)
    assert [verify(tokens, q, p, g) for _ in range(50)] == first


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match="target_probs"):
        verify(torch.tensor([0, 1]), Q.repeat(2, 1), P[None], torch.Generator())


def test_single_step_output_has_the_target_distribution():
    """10⁵ single rounds (γ = 1): draft ~ q, then the rule; the first output token must be ~ p.

    Chi-square against p, fixed seed, false-alarm rate FALSE_ALARM.
    """
    n = 100_000
    vocab = 6
    rng = np.random.default_rng(2024)
    p = torch.tensor(rng.dirichlet(np.ones(vocab)))
    q = torch.tensor(rng.dirichlet(np.ones(vocab)))
    g = torch.Generator().manual_seed(99)
    drafts = torch.multinomial(q, n, replacement=True, generator=g).tolist()
    target_rows = torch.stack([p, p])
    counts = np.zeros(vocab)
    for token in drafts:
        verdict = verify(torch.tensor([token]), q[None], target_rows, g)
        counts[token if verdict.n_accepted else verdict.next_token] += 1
    assert stats.chisquare(counts, n * p.numpy()).pvalue > FALSE_ALARM
