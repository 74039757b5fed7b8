"""One drafter first, another when the first proposes nothing (prompt lookup, else the model)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..sampling import SamplingParams
from .base import Allowed, Drafter, Proposal


class CompositeDrafter:
    """Tries ``first`` (prompt lookup, say); when it proposes nothing, ``fallback`` drafts.

    Both see every round's commit, so the fallback's cache stays in step with the sequence (a
    model drafter reads the tokens it skipped at its next proposal). ``rounds`` counts whose draft
    was used.
    """

    def __init__(self, first: Drafter, fallback: Drafter) -> None:
        if first.vocab_size != fallback.vocab_size:
            raise ValueError("composite drafter parts disagree on the vocabulary: "
                             f"{first.vocab_size} vs {fallback.vocab_size}")
        self.first, self.fallback = first, fallback
        self.vocab_size = first.vocab_size
        self.name = f"{first.name}, else {fallback.name}"
        self.reads_prompt = first.reads_prompt or fallback.reads_prompt
        self.rounds = {"first": 0, "fallback": 0}

    def begin(self, prompt: Sequence[int]) -> None:
        self.first.begin(prompt)
        self.fallback.begin(prompt)
        self.rounds = {"first": 0, "fallback": 0}

    def propose(self, sequence: Sequence[int], gamma: int, sampling: SamplingParams,
                generator: torch.Generator, allowed: Allowed | None = None) -> Proposal:
        """``first``'s draft if it has any token, else ``fallback``'s.

        Example: prompt lookup, else the bigram draft of :meth:`ModelDrafter.propose`'s example
        (vocabulary of 3), greedy, γ = 2. Sequence [0, 2, 0, 2]: the 2-gram (0, 2) occurred
        before, so lookup proposes [0, 2] (one-hot q, calls 0; ``rounds["first"]`` + 1). Sequence
        [2, 0]: lookup finds nothing, so the model drafts [1, 2] (calls 2; ``rounds["fallback"]`` + 1).
        """
        extra = {} if allowed is None else {"allowed": allowed}
        draft = self.first.propose(sequence, gamma, sampling, generator, **extra)
        if draft.tokens:
            self.rounds["first"] += 1
            return draft
        self.rounds["fallback"] += 1
        return self.fallback.propose(sequence, gamma, sampling, generator, **extra)

    def commit(self, length: int) -> None:
        self.first.commit(length)
        self.fallback.commit(length)
