"""The acceptance rule of speculative sampling (spec §2.3, the paper's Algorithm 1).

Terms, used the same way everywhere in specdec:

- **drafted** tokens: the γ tokens x_1..x_γ the draft proposed, x_i drawn from q_i
  (``draft_probs[i]``).
- **accepted**: drafted token x_i is kept with probability min(1, p_i(x_i) / q_i(x_i)), where p_i is
  the target's adjusted distribution at that position (``target_probs[i]``). Drafts are examined
  in order and the first one that is not kept ends the round; the ones before it are accepted.
- **recovered** token: after the first rejection at position i, the target's token is drawn from
  the residual norm(max(0, p_i − q_i)) (the paper's p′). It replaces the rejected draft.
- **bonus** token: when all γ drafts are accepted, one more token is drawn from the target's next
  distribution p_{γ+1} (``target_probs[γ]``), which the same target call already computed.

Either way a round ends with exactly one token from the target, the *next token*, so every round
yields between 1 and γ + 1 tokens, and each token has exactly the target's distribution.

Numerical guards (none of them changes the distribution):
- q_i(x_i) = 0 at a drafted token can only happen through rounding (x_i was drawn from q_i); the
  test ``u · q < p`` then accepts iff p > 0, the limit of min(1, p/q).
- A residual whose mass is zero in floating point: mathematically a rejection at position i
  implies q_i(x_i) > p_i(x_i) and so a residual of positive mass. Zero mass therefore means p ≈ q
  up to rounding, where the residual is undefined; we draw from p_i, the rule's limit as q → p.

The rule is a pure function: the random draws come from the ``generator`` passed in, so a round
can be replayed exactly from the same generator state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

RECOVERED = "recovered"
BONUS = "bonus"
NextTokenKind = Literal["recovered", "bonus"]


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one round's drafts."""

    n_accepted: int  # how many drafted tokens were accepted (a prefix of the drafts)
    next_token: int  # the target's token: recovered (after a rejection) or bonus (all accepted)
    kind: NextTokenKind


def verify(
    draft_tokens: torch.Tensor,  # [gamma] int64, the drafted tokens x_1..x_γ
    draft_probs: torch.Tensor,  # [gamma, vocab] q_i, the lists each draft was drawn from
    target_probs: torch.Tensor,  # [gamma + 1, vocab] p_i, the last row for the bonus token
    generator: torch.Generator,
) -> Verdict:
    """Accept a prefix of the drafts, then draw the recovered or bonus token (Algorithm 1)."""
    gamma = int(draft_tokens.shape[0])
    if target_probs.shape[0] != gamma + 1 or draft_probs.shape[0] != gamma:
        raise ValueError(
            f"shape mismatch: {gamma} drafted tokens need draft_probs [{gamma}, V] and target_probs "
            f"[{gamma + 1}, V], got {tuple(draft_probs.shape)} and {tuple(target_probs.shape)}"
        )
    n_accepted = count_accepted(draft_tokens, draft_probs, target_probs[:gamma], generator)
    if n_accepted == gamma:
        return Verdict(gamma, sample(target_probs[gamma], generator), BONUS)
    residual = residual_probs(target_probs[n_accepted], draft_probs[n_accepted])
    return Verdict(n_accepted, sample(residual, generator), RECOVERED)


def count_accepted(
    draft_tokens: torch.Tensor,  # [gamma]
    draft_probs: torch.Tensor,  # [gamma, vocab]
    target_probs: torch.Tensor,  # [gamma, vocab] (the rows that verify a draft)
    generator: torch.Generator,
) -> int:
    """Length of the accepted prefix: draft i survives when u_i · q_i(x_i) < p_i(x_i)."""
    gamma = int(draft_tokens.shape[0])
    if gamma == 0:
        return 0
    # One uniform draw per drafted position, always all γ of them, so the number of draws a round
    # consumes does not depend on where it stopped (a round replays from the generator state).
    draws = torch.rand(gamma, generator=generator, device=draft_probs.device, dtype=torch.float64).tolist()
    rows = torch.arange(gamma, device=draft_probs.device)
    q = draft_probs[rows, draft_tokens].tolist()
    p = target_probs[rows, draft_tokens].tolist()
    for i in range(gamma):
        if not draws[i] * q[i] < p[i]:
            return i
    return gamma


def residual_probs(target_row: torch.Tensor, draft_row: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)), the distribution of the recovered token. [vocab] → [vocab]."""
    residual = torch.clamp(target_row - draft_row, min=0.0)
    mass = residual.sum()
    if not bool(mass > 0):
        return target_row  # p ≈ q up to rounding: see the module docstring
    return residual / mass


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from a probability list [vocab] by inverting its CDF with one uniform.

    The CDF is accumulated in float64, so even a 150k-token vocabulary loses no visible mass;
    a token of probability 0 can never be drawn (its CDF step is empty).
    """
    cdf = probs.cumsum(-1, dtype=torch.float64)  # [vocab]
    u = torch.rand(1, generator=generator, device=probs.device, dtype=torch.float64) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u, right=True)), probs.shape[-1] - 1)


def acceptance_overlap(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """β = Σ_x min(p(x), q(x)) per row (spec §3.2): the chance a draft survives. [k, V] → [k]."""
    return torch.minimum(target_probs, draft_probs).sum(dim=-1)
