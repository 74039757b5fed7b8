"""The toy pair of the spec's figures, and the worked example of §2.3.

- The **toy pair**: two bigram models over an eight-word vocabulary (each next word depends only
  on the previous one). The draft is deliberately a bit off: at every word where there is a
  choice its probabilities overlap the target's by β = 0.9, so about 90% of drafts are accepted.
  ``ToyPair`` wraps fresh models with word-level ``encode`` / ``decode``, the same members the
  real model pair has, so the explorer's live view can run on it without any download.
- The **worked example**: target p = (cat 0.5, dog 0.3, fish 0.2), draft q = (0.6, 0.2, 0.2).
  ``worked_example_draws`` runs the acceptance rule on it many times and counts the outcomes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..checks import check_int
from ..rule import verify
from .bigram import BigramModel

TOY_WORDS: tuple[str, ...] = ("the", "cat", "dog", "sat", "ran", "on", "mat", ".")
TOY_PROMPT: tuple[str, ...] = ("the",)


def _table(rows: dict[str, dict[str, float]]) -> np.ndarray:
    index = {w: i for i, w in enumerate(TOY_WORDS)}
    table = np.zeros((len(TOY_WORDS), len(TOY_WORDS)))
    for word, row in rows.items():
        for nxt, prob in row.items():
            table[index[word], index[nxt]] = prob
    return table


# The target: probs[i, j] = P(next word j | word i).
TOY_TARGET = _table({
    "the": {"cat": 0.45, "dog": 0.40, "mat": 0.15},
    "cat": {"sat": 0.60, "ran": 0.30, ".": 0.10},
    "dog": {"ran": 0.55, "sat": 0.35, ".": 0.10},
    "sat": {"on": 0.85, ".": 0.15},
    "ran": {"on": 0.50, ".": 0.50},
    "on": {"the": 1.00},
    "mat": {".": 1.00},
    ".": {"the": 1.00},
})

# The draft: the same shape, a bit off (β = 0.9 on every row with a choice).
TOY_DRAFT = _table({
    "the": {"cat": 0.55, "dog": 0.30, "mat": 0.15},
    "cat": {"sat": 0.70, "ran": 0.20, ".": 0.10},
    "dog": {"ran": 0.45, "sat": 0.45, ".": 0.10},
    "sat": {"on": 0.95, ".": 0.05},
    "ran": {"on": 0.60, ".": 0.40},
    "on": {"the": 0.90, "mat": 0.10},
    "mat": {".": 1.00},
    ".": {"the": 1.00},
})


def toy_models() -> tuple[BigramModel, BigramModel]:
    """Fresh (target, draft) bigram models; each keeps its own cache, so one pair per user."""
    return BigramModel(TOY_TARGET), BigramModel(TOY_DRAFT)


class ToyPair:
    """The toy pair with the members of a real model pair: target, draft, encode, decode, EOS."""

    words = TOY_WORDS
    eos_token_ids: list[int] = []  # no end of text: generation stops at max_new_tokens

    def __init__(self) -> None:
        self.target, self.draft = toy_models()

    def encode(self, text: str, chat: bool = False) -> list[int]:
        """Whitespace-separated words → ids; ``chat`` is accepted and ignored (no template)."""
        index = {w: i for i, w in enumerate(TOY_WORDS)}
        words = text.replace(".", " . ").split()
        unknown = [w for w in words if w.lower() not in index]
        if unknown:
            raise ValueError(
                f"unknown word {unknown[0]!r}: the toy vocabulary is {' '.join(TOY_WORDS)}"
            )
        return [index[w.lower()] for w in words]

    def decode(self, ids: Sequence[int]) -> str:
        words = [TOY_WORDS[int(t)] for t in ids]
        return "".join(w if i == 0 or w == "." else " " + w for i, w in enumerate(words))


# --------------------------------------------------------------------------- the worked example

WORKED_WORDS: tuple[str, ...] = ("cat", "dog", "fish")
WORKED_TARGET: tuple[float, ...] = (0.5, 0.3, 0.2)  # p
WORKED_DRAFT: tuple[float, ...] = (0.6, 0.2, 0.2)  # q


def worked_example_draws(n: int = 10_000, seed: int | None = 0) -> dict:
    """Draw n tokens with the rule on the worked example (γ = 1) and count them per word.

    Each draw: the draft proposes x ~ q; ``rule.verify`` keeps it with probability
    min(1, p(x)/q(x)), otherwise replaces it with a recovered token from norm(max(0, p − q)).
    Returns the words, p, q, and per word how often it came out as an accepted draft and as a
    recovered token (their sum over n is the observed frequency).
    """
    check_int("n", n, 1, 1_000_000)
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    q = torch.tensor([WORKED_DRAFT], dtype=torch.float64)  # [1, 3]
    # Row 0 verifies the draft; row 1 is the bonus row verify needs for γ = 1 (its token is
    # the second token of the round, not counted here: we look at one position only).
    p = torch.tensor([WORKED_TARGET, WORKED_TARGET], dtype=torch.float64)  # [2, 3]
    drafted = torch.multinomial(q[0], n, replacement=True, generator=generator)  # [n], x ~ q
    accepted = [0] * len(WORKED_WORDS)
    recovered = [0] * len(WORKED_WORDS)
    for x in drafted.split(1):
        verdict = verify(x, q, p, generator)
        if verdict.n_accepted == 1:
            accepted[int(x)] += 1
        else:
            recovered[verdict.next_token] += 1
    return {
        "n": n,
        "seed": seed,
        "words": list(WORKED_WORDS),
        "target": list(WORKED_TARGET),
        "draft": list(WORKED_DRAFT),
        "accepted": accepted,
        "recovered": recovered,
        "observed": [(a + r) / n for a, r in zip(accepted, recovered, strict=True)],
    }
