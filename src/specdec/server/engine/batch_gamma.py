"""γ that knows the load: each engine step's γ of every ``--gamma auto`` request, priced with the batch's cost.

With one request, a round costs γ draft calls and one target call of γ + 1 rows (Thm 3.8's price). With n
requests in one engine step, the step costs the draft calls of the requests still drafting at each
position, batched (D(rows)), and ONE target call over every request's rows, T(Σ(γ_i + 1)). So the
step's tokens per second is

    Σ_i E[tokens](α_i, γ_i) / ( Σ_{s=1..max γ} D(n_s) + T(Σ_i (γ_i + 1)) ),   n_s = #{i drafting: γ_i >= s}

with E[tokens](α, γ) = (1 − α^(γ+1)) / (1 − α) (Eq. 1), each α_i learned from that request's own rounds
and D, T measured on the engine's own calls (``calls.CallCosts``). :func:`assign` maximises it (the best
common γ, then one request's γ up or down at a time): with T(k) flat up to k ≈ 3–4 rows on a CPU, a lone
request drafts long, eight requests draft short, or not at all when a row costs more than it brings.

The choice depends only on finished rounds (α_i, times), never on the step's own draws: exact for any γ.
A request with a fixed or heuristic γ keeps its own, and so does a reproducible ``--gamma auto`` one (a request
that gives its own ``seed``: ``session.RunSettings.reproducible``, never steered, so that its draws do not follow
the load); their rows are priced in as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ... import theory
from ...gamma import AdaptiveGamma, GammaPolicy
from ...stats import RoundRecord

Curve = Callable[[int], float]  # rows → seconds


@dataclass(frozen=True)
class Demand:
    """What one request brings to a step: its α, the most it may draft, and whether γ is ours to choose."""

    alpha: float
    max_gamma: int  # the budget's limit (remaining tokens − 1) and the policy's own cap
    model_drafted: bool  # its drafts cost draft-model calls (lookup and n-gram drafts cost ~nothing)
    chosen: int | None = None  # a fixed / heuristic / reproducible γ: priced as it is, never changed


def step_seconds(gammas: list[int], demands: list[Demand], target: Curve, draft: Curve) -> float:
    rows = sum(g + 1 for g in gammas)
    drafting = [g for g, d in zip(gammas, demands, strict=True) if d.model_drafted]
    draft_time = sum(draft(sum(1 for g in drafting if g >= s)) for s in range(1, max(drafting, default=0) + 1))
    return draft_time + target(rows)


def step_tokens(gammas: list[int], demands: list[Demand]) -> float:
    return sum(theory.expected_tokens(min(d.alpha, 0.999), g) for g, d in zip(gammas, demands, strict=True))


def assign(demands: list[Demand], target: Curve, draft: Curve) -> list[int]:
    """Every request's γ for one step (see the module's formula): the best γ common to every free request,
    then one γ up or down at a time while the step's rate grows. 0 is allowed: under a heavy load a
    request may do better not drafting at all for a step (plain decoding's row, at no draft cost)."""
    free = [i for i, d in enumerate(demands) if d.chosen is None]

    def rate(gammas: list[int]) -> float:
        return step_tokens(gammas, demands) / step_seconds(gammas, demands, target, draft)

    def common(g: int) -> list[int]:
        return [d.chosen if d.chosen is not None else min(g, d.max_gamma) for d in demands]

    top = max((demands[i].max_gamma for i in free), default=0)
    gammas = max((common(g) for g in range(top + 1)), key=rate)
    best_rate = rate(gammas)
    while True:
        move = None
        for i in free:
            for step in (1, -1):
                if not 0 <= gammas[i] + step <= demands[i].max_gamma:
                    continue
                gammas[i] += step
                trial = rate(gammas)
                gammas[i] -= step
                if trial > best_rate * (1 + 1e-9):
                    move, best_rate = (i, step), trial
        if move is None:
            return gammas
        gammas[move[0]] += move[1]


class SteeredGamma:
    """A ``--gamma auto`` request's policy inside the engine: γ as the engine assigns it for the step
    (``assigned``), or, alone in the engine (``assigned`` None), the request's own AdaptiveGamma's choice,
    as ``--gamma auto`` chooses in the CLI. Either way the AdaptiveGamma learns from every round; every
    ``explore_every``-th assigned round drafts one more than assigned, so α and the draft's cost stay measured
    when the batch's price says draft little. Not so from an assigned 0: a job that has not drafted for some steps
    has a draft that has not read the tokens since, and one exploring round would pay a draft call over all of
    them (eight jobs exploring together after seven plain steps: 200–270 ms against a 75 ms step, a quarter of
    the 8-client level's time, measured with ``--log-steps``). From 0 a job drafts 1 only in its first
    ``warmup`` rounds, while its draft is still in step (every round before drafted): enough for α to leave its
    prior (0.6), so that a batch whose drafts are good is priced as such; after that its α stays as its own
    rounds left it."""

    def __init__(self, inner: AdaptiveGamma, explore_every: int = 8, warmup: int = 4) -> None:
        self.inner, self.explore_every, self.warmup = inner, explore_every, warmup
        self.assigned: int | None = None
        self.chosen: list[int] = []

    @property
    def alpha(self) -> float:
        return self.inner.acceptance.alpha

    @property
    def max_gamma(self) -> int:
        return self.inner.max_gamma

    def choose(self) -> int:
        if self.assigned is None:
            gamma = self.inner.choose()
        else:
            if self.assigned > 0:
                explore = (len(self.chosen) + 1) % self.explore_every == 0
            else:  # its first rounds, every one drafted so far: the draft has read all but the last token
                explore = len(self.chosen) < self.warmup and all(g > 0 for g in self.chosen)
            gamma = min(self.assigned + 1, self.max_gamma) if explore else self.assigned
        self.chosen.append(gamma)
        return gamma

    def observe(self, record: RoundRecord, draft_seconds: float, target_seconds: float) -> None:
        self.inner.observe(record, draft_seconds, target_seconds)


def steer(policy: GammaPolicy) -> GammaPolicy:
    """The engine's policy for a request: an AdaptiveGamma becomes steered; any other stays its own."""
    return SteeredGamma(policy) if isinstance(policy, AdaptiveGamma) else policy
