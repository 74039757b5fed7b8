"""Standardized sampling (spec §2.2): every setting is a transform logits → probabilities.

Greedy, temperature, top-k, top-p and min-p all "adjust the probability list, then draw from
it". The same transform is applied to the target's logits (giving p, `target_probs`) and to the
draft's logits (giving q, `draft_probs`), so the acceptance rule only ever sees two lists.

Order of the filters: temperature, then top-k, then top-p, then min-p. ``temperature=0`` is
greedy: a one-hot list on the argmax, ties going to the lowest token id.

Tiny temperatures. A temperature below ``GREEDY_BELOW`` = 1e-5 (vLLM's threshold too) is greedy.
Why there, and why not sample down to T → 0:

- *Where it breaks*: ``logits / T`` overflows to ±inf once |logit| / T exceeds the dtype's largest
  value (float32 3.4e38, float64 1.8e308), and the softmax of a row holding +inf (or only -inf) is
  NaN; a draw from NaN returns a token of probability 0. For a float32 logit of 40 that is
  T < 1.2e-37 (the real pair printed padding tokens at ``--temperature 1e-38``); for the toy
  pair's float64 log-probabilities (|logit| ≈ 1–3) it is T < ~1e-308 (``1e-310`` failed). Even
  |logit| = 1e4, beyond anything a language model emits, overflows only below T = 3e-35.
- *Where it stops meaning anything*: dividing by T is exact to one rounding, i.e. the softmax of
  float32 ``logits / T`` is the exact softmax of logits each moved by at most half a unit in the
  last place (ulp), at every T. That ulp is 2^-17 = 7.6e-6 for logits in [64, 128). Once T is
  below the ulp, moving one logit by its last bit changes a probability ratio by more than a
  factor e: the draw among near-tied tokens is then decided by the logits' rounding, not by the
  model. At T = 1e-5 the ratio moves by at most e^0.76, and every token more than 104·T =
  1.04e-3 below the best logit already has probability exactly 0 (float32's exp underflows to 0
  below -103.97), so sampling there differs from greedy only among tokens tied to within 1e-3.
- Hence 1e-5: 30 orders of magnitude above the overflow, so from 1e-5 up ``logits / T`` is finite
  for every |logit| < 3.4e33 and the softmax is computed as written; below it, greedy (the
  T → 0 limit, exact ties going to the lowest id) is the one answer that is not rounding noise.
  ``probs_from_logits`` also refuses (FloatingPointError) to hand out a row that is not finite,
  so no NaN ever reaches a draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .checks import check_int

GREEDY_BELOW = 1e-5  # temperatures below this are greedy: see the module docstring


@dataclass(frozen=True)
class SamplingParams:
    """How logits become the list we draw from. 0 (top_k, min_p) and 1.0 (top_p) disable a filter."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0 and self.temperature != float("inf")):
            raise ValueError(f"temperature={self.temperature!r} is invalid: must be a finite number >= 0 (0 = greedy)")
        check_int("top_k", self.top_k, 0, note=" (0 = off)")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p={self.top_p!r} is invalid: must be in (0, 1] (1.0 = off)")
        if not (0.0 <= self.min_p < 1.0):
            raise ValueError(f"min_p={self.min_p!r} is invalid: must be in [0, 1) (0 = off)")

    @property
    def greedy(self) -> bool:
        """Temperature 0, or one below ``GREEDY_BELOW`` (whose softmax would be rounding noise or NaN)."""
        return self.temperature < GREEDY_BELOW


GREEDY = SamplingParams(temperature=0.0)


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Adjusted next-token probabilities. logits: [..., vocab] → [..., vocab], rows sum to 1.

    ``-inf`` logits are tokens of probability zero (a bigram table's zeros, say). A row that comes
    out NaN (the logits held NaN or +inf, or no token had a finite logit) is a FloatingPointError,
    never a list to draw from.
    """
    if params.greedy:
        return _one_hot_argmax(logits)
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if params.temperature != 1.0:
        logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        logits = _keep_top_k(logits, params.top_k)
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = _keep_top_p(probs, params.top_p)
    if params.min_p > 0.0:
        probs = _keep_min_p(probs, params.min_p)
    _check_finite(probs, params)
    return probs


def _check_finite(probs: torch.Tensor, params: SamplingParams) -> None:
    # One reduction: a NaN anywhere makes its row's sum NaN (softmax never gives +inf).
    totals = probs.sum(dim=-1)
    if not bool(torch.isfinite(totals).all()):
        raise FloatingPointError(
            f"the adjusted probabilities at temperature={params.temperature!r} are NaN: the model's logits hold "
            "NaN or +inf, or a row gives no token a finite logit; refusing to draw a token from them"
        )


def _one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    # torch.argmax returns the first maximal index: ties go to the lowest token id.
    best = logits.argmax(dim=-1, keepdim=True)
    exact = logits.is_floating_point() and logits.dtype not in (torch.float16, torch.bfloat16)
    dtype = logits.dtype if exact else torch.float32
    return torch.zeros(logits.shape, dtype=dtype, device=logits.device).scatter_(-1, best, 1.0)


def _unsort(keep_sorted: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Scatter a keep-mask given in sorted order back to token order."""
    return torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)


def _keep_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    # Exactly k tokens survive; among equal logits the lower token id wins (stable sort).
    _, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    kept = torch.full_like(logits, float("-inf"))
    return kept.scatter_(-1, order[..., :k], logits.gather(-1, order[..., :k]))


def _keep_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    # The nucleus: the smallest set of most likely tokens whose cumulative probability reaches
    # top_p. A token is kept when the mass strictly before it (in sorted order) is below top_p.
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep = _unsort(mass_before < top_p, order)
    return _renormalize(probs * keep)


def _keep_min_p(probs: torch.Tensor, min_p: float) -> torch.Tensor:
    # Keep tokens at least min_p times as likely as the most likely one.
    threshold = probs.amax(dim=-1, keepdim=True) * min_p
    return _renormalize(torch.where(probs >= threshold, probs, torch.zeros_like(probs)))


def _renormalize(probs: torch.Tensor) -> torch.Tensor:
    return probs / probs.sum(dim=-1, keepdim=True)
