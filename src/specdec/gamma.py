"""How many tokens to draft each round: a fixed γ, or a policy that chooses γ from past rounds.

A policy may look only at rounds already finished (their records and call times), never at the
round it is choosing for; so the number of drafted tokens is fixed before the round's draws and
the output keeps exactly the target's distribution (the rule is exact for any γ). No policy here
draws random numbers: the sampling generator's draws belong to the rule alone.

The decode loop calls ``choose()`` before each round and ``observe(...)`` after it. Every policy
here keeps the γ it chose per round in ``chosen`` (the loop may draft fewer near the budget).

- ``FixedGamma``: the paper's setting, the same γ every round.
- ``HeuristicGamma``: transformers' ``num_assistant_tokens_schedule="heuristic"``.
- ``AdaptiveGamma`` (``--gamma auto``): learns α and the call costs online and maximises Thm 3.8.

A γ given by name (``--gamma``, a request's ``speculative.gamma``) becomes a policy in
:mod:`specdec.choices` (``parse_gamma``, ``make_policy``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from . import theory
from .checks import check_int
from .stats import RoundRecord

AUTO_MAX_GAMMA = 16  # the γ range --gamma auto searches (a fixed γ may go to choices.MAX_GAMMA)


@runtime_checkable
class GammaPolicy(Protocol):
    chosen: list[int]  # the γ chosen per round so far

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
        self.chosen: list[int] = []

    def choose(self) -> int:
        self.chosen.append(self.gamma)
        return self.gamma

    def observe(self, record: RoundRecord, draft_seconds: float, target_seconds: float) -> None:
        pass

    def __repr__(self) -> str:
        return f"FixedGamma({self.gamma})"


class HeuristicGamma:
    """transformers' assistant schedule ("heuristic"): start at ``start`` (transformers' default
    ``num_assistant_tokens`` is 20); +2 after a round whose drafts were all accepted, −1 after any
    other round, never below 1. A round that drafted nothing (the budget's last token) changes
    nothing. ``max_gamma`` caps it (transformers has no cap; None = none)."""

    def __init__(self, start: int = 20, max_gamma: int | None = None) -> None:
        check_gamma(start)
        if max_gamma is not None:
            check_gamma(max_gamma)
        self.gamma = start if max_gamma is None else min(start, max_gamma)
        self.max_gamma = max_gamma
        self.chosen: list[int] = []

    def choose(self) -> int:
        self.chosen.append(self.gamma)
        return self.gamma

    def observe(self, record: RoundRecord, draft_seconds: float, target_seconds: float) -> None:
        if not record.drafted:
            return
        if record.n_accepted == len(record.drafted):
            self.gamma += 2
            if self.max_gamma is not None:
                self.gamma = min(self.gamma, self.max_gamma)
        else:
            self.gamma = max(1, self.gamma - 1)

    def __repr__(self) -> str:
        return f"HeuristicGamma(γ={self.gamma})"


class _Mean:
    """An exponentially weighted mean: each new value counts 1, older ones fade by ``decay``."""

    __slots__ = ("total", "weight")

    def __init__(self) -> None:
        self.total = self.weight = 0.0

    def add(self, value: float, decay: float) -> None:
        self.total = decay * self.total + value
        self.weight = decay * self.weight + 1.0

    def value(self, prior: float, prior_weight: float) -> float:
        """The mean shrunk toward ``prior``, which counts as ``prior_weight`` observations."""
        return (self.total + prior_weight * prior) / (self.weight + prior_weight)


class AcceptanceEstimate:
    """α and the per-position acceptance a_i learned from the β of every verified position.

    A round's ``betas`` holds β at draft positions 1, 2, … up to the first rejection; β at
    position i is seen only when drafts 1..i−1 were accepted, so the mean of those is
    P(draft i accepted | drafts before it accepted), exactly a_i of
    :func:`specdec.theory.expected_tokens_by_position`. Each a_i is shrunk toward the global α,
    which is itself shrunk toward ``prior_alpha`` (so round 1 has a sensible value). The prior counts as one
    observation: a 128-token answer is 30-40 rounds, and counted as four it kept the default pair at γ 1-2 for a
    dozen of them (mean γ 2.0-2.3, 0.87-0.89x a fixed γ 5 on the main job; as one: 2.8-3.3, 1.01-1.04x).
    """

    def __init__(self, prior_alpha: float = 0.6, prior_weight: float = 1.0, decay: float = 0.99,
                 position_weight: float = 3.0, position_decay: float = 0.95) -> None:
        self.prior_alpha, self.prior_weight, self.decay = prior_alpha, prior_weight, decay
        self.position_weight, self.position_decay = position_weight, position_decay
        self.overall = _Mean()
        self.by_position: list[_Mean] = []

    def observe(self, betas: tuple[float, ...]) -> None:
        for i, b in enumerate(betas):
            self.overall.add(b, self.decay)
            if i == len(self.by_position):
                self.by_position.append(_Mean())
            self.by_position[i].add(b, self.position_decay)

    @property
    def alpha(self) -> float:
        return self.overall.value(self.prior_alpha, self.prior_weight)

    def positional(self, gamma: int) -> list[float]:
        """a_1..a_γ; positions never reached yet take the global α."""
        alpha = self.alpha
        known = [m.value(alpha, self.position_weight) for m in self.by_position[:gamma]]
        return known + [alpha] * (gamma - len(known))


class CostEstimate:
    """Seconds per drafted token (d) and per target call scoring k tokens (T(k)), as measured.

    T(k): a running mean per k, shrunk toward a line a + b·k fitted to those means (b >= 0), which
    also gives every k not seen yet; with one k seen, the line has the prior relative slope
    ``prior_slope`` (T(k)/T(1) = 1 + prior_slope·(k − 1)). Before any call was timed the units
    are T(1) = 1 and d = ``prior_c``. An outlier (a busy machine) counts at most 3× the mean so far.
    """

    def __init__(self, prior_c: float = 0.2, prior_slope: float = 0.1, decay: float = 0.9) -> None:
        self.prior_c, self.prior_slope, self.decay = prior_c, prior_slope, decay
        self.draft = _Mean()
        self.by_k: dict[int, _Mean] = {}

    def observe(self, n_drafted: int, draft_calls: int, draft_seconds: float, target_seconds: float) -> None:
        if n_drafted:
            per_token = draft_seconds / max(draft_calls, n_drafted)
            self.draft.add(self._clip(per_token, self.draft), self.decay)
        self.observe_call(n_drafted + 1, target_seconds)  # the target scores the last token and the drafts

    def observe_call(self, k: int, seconds: float) -> None:
        """One target call that scored ``k`` rows in ``seconds``."""
        mean = self.by_k.setdefault(k, _Mean())
        mean.add(self._clip(seconds, mean), self.decay)

    @staticmethod
    def _clip(value: float, mean: _Mean) -> float:
        if mean.weight > 0:
            return min(value, 3.0 * mean.total / mean.weight)
        return value

    def call_curve(self) -> Callable[[int], float]:
        """k → T(k), the seconds of one call scoring k rows (in units of T(1) before any call was timed)."""
        means = {k: m.total / m.weight for k, m in self.by_k.items() if m.weight > 0}
        a, b = self._fit_line(means)

        def curve(k: int) -> float:
            line = a + b * k
            if k not in means:
                return line
            w = self.by_k[k].weight
            return (w * means[k] + line) / (w + 1.0)

        return curve

    def _fit_line(self, means: dict[int, float]) -> tuple[float, float]:
        if not means:
            return 1.0 - self.prior_slope, self.prior_slope
        if len(means) == 1:
            (k0, t0), = means.items()
            t1 = t0 / (1.0 + self.prior_slope * (k0 - 1))
            return t1 * (1.0 - self.prior_slope), t1 * self.prior_slope
        weights = {k: self.by_k[k].weight for k in means}
        total = sum(weights.values())
        k_bar = sum(w * k for k, w in weights.items()) / total
        t_bar = sum(w * means[k] for k, w in weights.items()) / total
        sxx = sum(w * (k - k_bar) ** 2 for k, w in weights.items())
        sxy = sum(w * (k - k_bar) * (means[k] - t_bar) for k, w in weights.items())
        b = max(0.0, sxy / sxx)
        floor = 0.05 * max(means.values())  # keep T(1) > 0 whatever the noise
        a = max(t_bar - b * k_bar, floor - b)
        return a, b

    def draft_seconds(self, target_one: float) -> float:
        """d, seconds per drafted token; before any draft was timed, prior_c · T(1)."""
        if self.draft.weight == 0:
            return self.prior_c * target_one
        return self.draft.total / self.draft.weight


class AdaptiveGamma:
    """``--gamma auto``: each round's γ maximises the expected speed-up learned so far.

    Expected tokens per round come from the β of past rounds (:class:`AcceptanceEstimate`: the
    global α in Eq. 1, or with ``positional`` the acceptance at each draft position), the costs
    from the measured call times (:class:`CostEstimate`): γ maximises E[tokens](γ) / (γ·d +
    T(γ + 1)), the cost-curve form of Thm 3.8, over 1..max_gamma. Global α is the default: on 87
    rounds of the default pair at γ = 8 (temperatures 0 and 1) it forecast each round's accepted
    run as well as the per-position estimate (RMSE 3.56 vs 3.58 and 3.10 vs 3.09 tokens, log-
    likelihood −2.10 vs −2.16 and −2.00 vs −2.05 per round), and chose γ as well offline. ``c`` and
    ``target_cost`` fix the costs instead (c = d/T(1); target_cost as in
    :func:`specdec.theory.expected_speedup_cost_curve`): then γ depends on the β alone, so a seeded run repeats exactly.

    Exploration, deterministic: every ``explore_every``-th round drafts one more or one fewer
    (alternately) than the best γ, so the cost of the neighbouring k and the acceptance one
    position further are measured too and the choice can move. A neighbour of the optimum costs
    little (the speed-up is flat there).
    """

    def __init__(self, max_gamma: int = AUTO_MAX_GAMMA, *, positional: bool = False, explore_every: int = 8,
                 c: float | None = None, target_cost: theory.TargetCost | None = None,
                 acceptance: AcceptanceEstimate | None = None, costs: CostEstimate | None = None) -> None:
        check_gamma(max_gamma)
        check_int("explore_every", explore_every, 2, note=" (rounds)")
        if c is not None or target_cost is not None:  # validate them now, not in round 1
            theory.expected_speedup_cost_curve(0.5, max_gamma, c or 0.0, target_cost or (lambda k: 1.0))
        self.max_gamma, self.positional, self.explore_every = max_gamma, positional, explore_every
        self.fixed_c, self.fixed_curve = c, target_cost
        self.acceptance = acceptance or AcceptanceEstimate()
        self.costs = costs or CostEstimate()
        self.rounds = 0
        self.chosen: list[int] = []

    def choose(self) -> int:
        best = self.best_gamma()
        self.rounds += 1
        gamma = best
        if self.rounds % self.explore_every == 0:
            step = 1 if (self.rounds // self.explore_every) % 2 else -1
            gamma = best + step if 1 <= best + step <= self.max_gamma else best - step
            gamma = min(max(gamma, 1), self.max_gamma)
        self.chosen.append(gamma)
        return gamma

    def observe(self, record: RoundRecord, draft_seconds: float, target_seconds: float) -> None:
        self.acceptance.observe(record.betas)
        self.costs.observe(len(record.drafted), record.draft_calls, draft_seconds, target_seconds)

    def predicted_speedups(self) -> list[float]:
        """The expected speed-up over plain decoding for γ = 1..max_gamma, from what was learned."""
        curve = self.fixed_curve if self.fixed_curve is not None else self.costs.call_curve()
        t1 = curve(1) if callable(curve) else curve[1]
        c = self.fixed_c if self.fixed_c is not None else self.costs.draft_seconds(t1) / t1
        if self.positional:
            acceptance = self.acceptance.positional(self.max_gamma)
        else:
            acceptance = [self.acceptance.alpha] * self.max_gamma
        # theory.expected_speedup_by_position for every γ at once: tokens accumulate along γ.
        speedups, tokens, survive = [], 1.0, 1.0
        for g in range(1, self.max_gamma + 1):
            survive *= acceptance[g - 1]
            tokens += survive
            verify = (curve(g + 1) if callable(curve) else curve[g + 1]) / t1
            speedups.append(tokens / (g * c + verify))
        return speedups

    def best_gamma(self) -> int:
        """The γ with the largest predicted speed-up (ties to the smaller γ)."""
        speedups = self.predicted_speedups()
        return max(range(len(speedups)), key=lambda i: (speedups[i], -i)) + 1

    def __repr__(self) -> str:
        return f"AdaptiveGamma(α̂={self.acceptance.alpha:.2f}, rounds={self.rounds})"


def check_gamma(gamma) -> None:
    check_int("gamma", gamma, note=" (drafted tokens per round)")


def as_policy(gamma: int | GammaPolicy) -> GammaPolicy:
    """An int becomes a FixedGamma; a policy is used as it is."""
    if is_policy(gamma):
        return gamma
    return FixedGamma(gamma)


def is_policy(value) -> bool:
    # The same test as isinstance(value, GammaPolicy), without the Protocol machinery's cost
    # (it runs once per generation, thousands of times in the exactness tests).
    return not isinstance(value, (int, str)) and callable(getattr(value, "choose", None)) \
        and callable(getattr(value, "observe", None))
