"""How many tokens to draft each round: a fixed γ, or a policy that chooses γ from past rounds.

A policy may look only at rounds already finished (their records and call times), never at the
round it is choosing for; so the number of drafted tokens is fixed before the round's draws and
the output keeps exactly the target's distribution (the rule is exact for any γ).

The decode loop calls ``choose()`` before each round and ``observe(...)`` after it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .stats import RoundRecord


@runtime_checkable
class GammaPolicy(Protocol):
    def choose(self) -> int:
        """γ for the next round (an integer >= 1; the loop clips it near the token budget)."""
        ...

    def observe(self, record: RoundRecord, draft_seconds: float, target_seconds: float) -> None:
        """Learn from a finished round: its record and the time its draft and target calls took."""
        ...


class FixedGamma:
    """The paper's setting: the same γ every round."""

    def __init__(self, gamma: int) -> None:
        check_gamma(gamma)
        self.gamma = gamma

    def choose(self) -> int:
        return self.gamma

    def observe(self, record: RoundRecord, draft_seconds: float, target_seconds: float) -> None:
        pass

    def __repr__(self) -> str:
        return f"FixedGamma({self.gamma})"


def check_gamma(gamma) -> None:
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma={gamma!r} is invalid: must be an integer >= 1 (drafted tokens per round)")


def as_policy(gamma: int | GammaPolicy) -> GammaPolicy:
    """An int becomes a FixedGamma; a policy is used as it is."""
    if isinstance(gamma, GammaPolicy) and not isinstance(gamma, int):
        return gamma
    return FixedGamma(gamma)
