"""The paper's analysis (spec §3.1–3.5): acceptance, tokens per target run, speed-up, arithmetic.

Notation, as in the spec and the paper (Leviathan, Kalman, Matias, ICML 2023):

- p: the target's adjusted distribution, q: the draft's adjusted distribution (spec §2.2).
- β = Σ_x min(p(x), q(x)): the chance one drafted token is accepted (§3.2).
- α = E[β]: the acceptance rate, β averaged over the text (§3.2). Valid range: [0, 1).
- γ: how many tokens the draft proposes per round (an integer ≥ 0; γ = 0 is ordinary decoding).
- c: time of one draft run / time of one target run (≥ 0).
- ĉ: arithmetic of one draft run / arithmetic of one target run (≥ 0).

Every function is pure and checks its input, raising ``ValueError`` with a message that names the
bad value and the accepted range.
"""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .checks import check_int

TargetCost = Callable[[int], float] | Sequence[float] | Mapping[int, float]

MAX_GAMMA_LIMIT = 1024  # the largest γ the searches below will scan (a guard against typos)
_TIE_RTOL = 1e-12  # speed-ups this close count as a tie, which goes to the smaller γ


# --------------------------------------------------------------------------- input checks


def _real(value: Any, name: str, accepted: str) -> float:
    if isinstance(value, (bool, str, bytes)):
        raise ValueError(f"{name} must be a number in {accepted}, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in {accepted}, got {value!r}") from None


def _check_alpha(alpha: Any) -> float:
    a = _real(alpha, "α (alpha)", "[0, 1)")
    if not 0.0 <= a < 1.0:  # also rejects NaN
        raise ValueError(f"α (alpha) must be in [0, 1), got {alpha!r}")
    return a


def _check_cost(cost: Any, name: str = "c") -> float:
    v = _real(cost, name, "[0, ∞)")
    if not 0.0 <= v < math.inf:
        raise ValueError(f"{name} must be finite and ≥ 0, got {cost!r}")
    return v


def _check_int(value: Any, name: str, low: int, high: int | None = None) -> int:
    """``checks.check_int``, the one integer check, also taking NumPy's integers (anything with ``__index__``)."""
    if not isinstance(value, bool) and hasattr(type(value), "__index__"):
        value = operator.index(value)
    return check_int(name, value, low, high)


def _check_gamma(gamma: Any, low: int = 0) -> int:
    return _check_int(gamma, "γ (gamma)", low)


# --------------------------------------------------------------------------- §3.2: β and α


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor can only exist if torch was imported already
    return torch is not None and isinstance(x, torch.Tensor)


def _as_pair(target_probs: Any, draft_probs: Any) -> tuple[Any, Any, Any]:
    """Both lists as the same array kind (torch if either is a tensor), plus that kind's module."""
    if _is_tensor(target_probs) or _is_tensor(draft_probs):
        import torch

        ref = target_probs if _is_tensor(target_probs) else draft_probs
        p = torch.as_tensor(target_probs, dtype=ref.dtype, device=ref.device)
        q = torch.as_tensor(draft_probs, dtype=ref.dtype, device=ref.device)
        xp = torch
    else:
        p, q, xp = np.asarray(target_probs, dtype=float), np.asarray(draft_probs, dtype=float), np
    if tuple(p.shape) != tuple(q.shape) or p.ndim == 0 or p.shape[-1] == 0:
        raise ValueError(
            "target_probs and draft_probs must have the same shape [..., vocab] with vocab ≥ 1, "
            f"got {tuple(p.shape)} and {tuple(q.shape)}"
        )
    for name, x in (("target_probs", p), ("draft_probs", q)):
        if not bool((x >= 0).all()) or not bool(xp.isfinite(x).all()):
            raise ValueError(f"{name} must be probabilities: finite and ≥ 0 (found a bad entry)")
    return p, q, xp


def _scalar_if_1d(x: Any) -> Any:
    return float(x) if isinstance(x, np.ndarray | np.generic) and np.ndim(x) == 0 else x


def beta(target_probs: Any, draft_probs: Any) -> Any:
    """β = Σ_x min(p(x), q(x)), the acceptance probability of one drafted token (§3.2).

    The last axis is the vocabulary; leading axes are kept (one β per position). Accepts numpy
    arrays, lists or torch tensors: returns a tensor if either input is one, otherwise a numpy
    array, or a float for 1-D inputs.
    """
    p, q, xp = _as_pair(target_probs, draft_probs)
    return _scalar_if_1d(xp.minimum(p, q).sum(-1))


def d_lk(target_probs: Any, draft_probs: Any) -> Any:
    """D_LK(p, q) = Σ_x |p(x) − q(x)| / 2 = 1 − β, the paper's divergence (§3.2).

    Same inputs and return kinds as :func:`beta`. It is the total variation distance of p and q.
    """
    p, q, xp = _as_pair(target_probs, draft_probs)
    return _scalar_if_1d(xp.abs(p - q).sum(-1) / 2)


# --------------------------------------------------------------------------- §3.1–3.5: formulas


def expected_tokens(alpha: float, gamma: int) -> float:
    """Eq. (1): E[#tokens per target run] = (1 − α^(γ+1)) / (1 − α) = 1 + α + … + α^γ."""
    a, g = _check_alpha(alpha), _check_gamma(gamma)
    return (1.0 - a ** (g + 1)) / (1.0 - a)


def expected_speedup(alpha: float, gamma: int, c: float) -> float:
    """Theorem 3.8: expected wall-time improvement (1 − α^(γ+1)) / ((1 − α)(γc + 1))."""
    g, cc = _check_gamma(gamma), _check_cost(c)
    return expected_tokens(alpha, g) / (g * cc + 1.0)


def guaranteed_speedup(alpha: float, c: float) -> float | None:
    """Corollary 3.9: if α > c, γ = 1 already gives at least (1 + α) / (1 + c) > 1; else None.

    When α ≤ c no γ is faster than ordinary decoding (each drafted token adds c and yields ≤ α).
    """
    a, cc = _check_alpha(alpha), _check_cost(c)
    return (1.0 + a) / (1.0 + cc) if a > cc else None


def expected_arithmetic(alpha: float, gamma: int, c_hat: float) -> float:
    """Theorem 3.11: factor of total arithmetic, (1 − α)(γĉ + γ + 1) / (1 − α^(γ+1))."""
    g, ch = _check_gamma(gamma), _check_cost(c_hat, "ĉ (c_hat)")
    return (g * ch + g + 1.0) / expected_tokens(alpha, g)


def speedup_bound(alpha: float) -> float:
    """Negligible-cost draft (c ≈ 0, §3.4): the speed-up is bounded by 1 / (1 − α) for any γ."""
    return 1.0 / (1.0 - _check_alpha(alpha))


def _cost_ratio(target_cost: TargetCost, k: int) -> float:
    """T(k) / T(1), with T given as a callable or indexable by k (``target_cost[k]``)."""

    def at(j: int) -> float:
        try:
            raw = target_cost(j) if callable(target_cost) else target_cost[j]
        except (IndexError, KeyError):
            raise ValueError(
                f"target_cost has no entry for k = {j} (a target call scoring {j} tokens); "
                "a sequence must be indexed by k, i.e. target_cost[k] = T(k) for k = 1..γ+1"
            ) from None
        t = _real(raw, f"target_cost({j})", "(0, ∞)")
        if not 0.0 < t < math.inf:
            raise ValueError(f"target_cost({j}) must be finite and > 0, got {raw!r}")
        return t

    return at(k) / at(1)


def expected_speedup_cost_curve(
    alpha: float, gamma: int, c: float, target_cost: TargetCost
) -> float:
    """Thm 3.8 with a measured target cost curve: E[#tokens] / (γc + T(γ+1) / T(1)).

    ``target_cost`` gives T(k), the time of one target call scoring k tokens (any unit: only
    T(γ+1) / T(1) is used): a callable ``T(k)``, or a sequence or mapping with ``target_cost[k]``
    = T(k) for k = 1..γ+1 (index 0 of a sequence is not used). With T(k) = 1 for all k this is
    exactly Theorem 3.8, whose proof assumes the target scores γ + 1 tokens as fast as 1.
    """
    g, cc = _check_gamma(gamma), _check_cost(c)
    return expected_tokens(alpha, g) / (g * cc + _cost_ratio(target_cost, g + 1))


def _speedup(alpha: float, gamma: int, c: float, target_cost: TargetCost | None) -> float:
    if target_cost is None:
        return expected_speedup(alpha, gamma, c)
    return expected_speedup_cost_curve(alpha, gamma, c, target_cost)


def _argmax_gamma(speedups: Sequence[float]) -> int:
    """Index + 1 of the largest speed-up; near-ties (relative 1e-12) go to the smaller γ."""
    best = 0
    for i, s in enumerate(speedups):
        if s > speedups[best] * (1.0 + _TIE_RTOL):
            best = i
    return best + 1


def optimal_gamma(
    alpha: float, c: float, max_gamma: int = 64, target_cost: TargetCost | None = None
) -> int:
    """The integer γ in [1, max_gamma] maximising the expected speed-up (§3.5, Figure 3).

    Uses Theorem 3.8, or with ``target_cost`` its cost-curve form (see
    :func:`expected_speedup_cost_curve`). Ties go to the smaller γ. With c = 0 and a flat cost
    curve the speed-up keeps rising with γ, so the answer is ``max_gamma``.
    """
    _check_alpha(alpha)
    _check_cost(c)
    n = _check_int(max_gamma, "max_gamma", 1, MAX_GAMMA_LIMIT)
    return _argmax_gamma([_speedup(alpha, g, c, target_cost) for g in range(1, n + 1)])


# --------------------------------------------------------------------------- a plan for each γ


@dataclass(frozen=True)
class PlanRow:
    """Predictions for one γ, relative to ordinary decoding.

    Tokens per target run (Eq. 1), speed-up (Thm 3.8), arithmetic factor (Thm 3.11).
    """

    gamma: int
    expected_tokens: float
    speedup: float
    arithmetic: float
    best: bool  # True on exactly one row: the optimal γ (§3.5)


def plan(
    alpha: float,
    c: float,
    c_hat: float | None = None,
    max_gamma: int = 12,
    target_cost: TargetCost | None = None,
) -> list[PlanRow]:
    """One :class:`PlanRow` per γ = 1..max_gamma; ĉ defaults to c (arithmetic tracks time).

    The best row is the one :func:`optimal_gamma` picks over the same range.
    """
    a, cc = _check_alpha(alpha), _check_cost(c)
    ch = cc if c_hat is None else _check_cost(c_hat, "ĉ (c_hat)")
    n = _check_int(max_gamma, "max_gamma", 1, MAX_GAMMA_LIMIT)
    gammas = range(1, n + 1)
    speedups = [_speedup(a, g, cc, target_cost) for g in gammas]
    best = _argmax_gamma(speedups)
    return [
        PlanRow(g, expected_tokens(a, g), s, expected_arithmetic(a, g, ch), g == best)
        for g, s in zip(gammas, speedups, strict=True)
    ]


# --------------------------------------------------------------------------- varying γ, per-position acceptance


def _check_acceptance(acceptance: Sequence[float], gamma: int) -> list[float]:
    if len(acceptance) < gamma:
        raise ValueError(
            f"acceptance has {len(acceptance)} entries but γ = {gamma} needs one per drafted position "
            f"(a_1..a_{gamma})"
        )
    out = []
    for i, a in enumerate(acceptance[:gamma], start=1):
        v = _real(a, f"acceptance a_{i}", "[0, 1]")
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"acceptance a_{i} must be in [0, 1], got {a!r}")
        out.append(v)
    return out


def expected_tokens_by_position(acceptance: Sequence[float], gamma: int) -> float:
    """E[#tokens per target run] when draft i of a round survives with probability a_i, given
    that drafts 1..i−1 did: 1 + a_1 + a_1·a_2 + … + a_1⋯a_γ. With every a_i = α this is Eq. (1).

    ``acceptance`` holds a_1, a_2, … (at least γ of them, each in [0, 1]; a_i = 1 is allowed).
    """
    g = _check_gamma(gamma)
    total, survive = 1.0, 1.0
    for a in _check_acceptance(acceptance, g):
        survive *= a
        total += survive
    return total


def expected_speedup_by_position(
    acceptance: Sequence[float], gamma: int, c: float, target_cost: TargetCost | None = None
) -> float:
    """Thm 3.8 (or its cost-curve form with ``target_cost``) with per-position acceptance:
    :func:`expected_tokens_by_position` / (γc + T(γ+1)/T(1)), T(k) = T(1) when not given."""
    g, cc = _check_gamma(gamma), _check_cost(c)
    verify = 1.0 if target_cost is None else _cost_ratio(target_cost, g + 1)
    return expected_tokens_by_position(acceptance, g) / (g * cc + verify)


def expected_speedup_over_rounds(alpha: float, gammas: Sequence[int], c: float) -> float:
    """Thm 3.8 for a run whose rounds drafted γ_1, γ_2, … tokens (γ = 0: a plain step):
    Σ E[#tokens](γ_r) / Σ (γ_r·c + 1), expected tokens over expected time. For a fixed γ it is
    :func:`expected_speedup`."""
    if not len(gammas):
        raise ValueError("gammas must hold at least one round's γ (got none)")
    cc = _check_cost(c)
    tokens = sum(expected_tokens(alpha, g) for g in gammas)
    return tokens / sum(_check_gamma(g) * cc + 1.0 for g in gammas)
