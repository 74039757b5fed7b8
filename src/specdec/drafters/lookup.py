"""Prompt lookup: draft by copying what followed the latest earlier occurrence of the text's end.

The paper's "copy from the context" guesser (spec §3.6, any guesser works). Code edits,
summaries and answers that quote their prompt repeat long stretches of it; when the last n
tokens of the sequence occurred before, the tokens that followed that occurrence are a cheap and
often right guess for what comes next.

The rule, for one round: for n from ``max_ngram`` down to ``min_ngram``, take the sequence's last
n tokens; if they occurred earlier (in the prompt or the output), propose up to γ of the tokens
that followed their most recent earlier occurrence, and stop. The copy may run into the tokens it
is proposing (a repeating pattern continues itself). No match at any n: propose nothing, and the
round is a plain target step.

The guess is a deterministic function of the sequence so far, so its q is one-hot on each guessed
token and the acceptance rule stays exact at any temperature: a guess x is kept with probability
p(x), and greedy keeps it iff it is the target's argmax.

The search is an index, n-gram → the position right after its latest occurrence, extended by the
tokens added since the last round; a round costs O(max_ngram + γ) dictionary operations whatever
the sequence length.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..checks import check_int, is_int
from ..sampling import SamplingParams
from .base import Allowed, Proposal, one_hot_rows

DEFAULT_MAX_NGRAM = 3  # the longest suffix looked up (transformers' max_matching_ngram_size is 2)
DEFAULT_MIN_NGRAM = 2  # one-token matches guess badly (code edits, 200 tokens: α 0.83 vs 0.92 with 2)


class PromptLookupDrafter:
    """Drafts by prompt lookup; q is one-hot, no model is called (``Proposal.calls == 0``)."""

    reads_prompt = False

    def __init__(
        self,
        vocab_size: int,
        *,
        max_ngram: int = DEFAULT_MAX_NGRAM,
        min_ngram: int = DEFAULT_MIN_NGRAM,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        check_int("vocab_size", vocab_size)
        check_int("min_ngram", min_ngram)
        if not is_int(max_ngram) or max_ngram < min_ngram:
            raise ValueError(f"max_ngram={max_ngram!r} is invalid: must be an integer >= min_ngram ({min_ngram})")
        self.vocab_size = vocab_size
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.device, self.dtype = torch.device(device), dtype
        self.name = f"prompt lookup (n-grams of {min_ngram}..{max_ngram} tokens)"
        self._tokens: list[int] = []  # the sequence as far as it is indexed
        # _follows[n - min_ngram]: n-gram → index of the token after its latest occurrence
        self._follows: list[dict[tuple[int, ...], int]] = []
        self.begin([])

    def begin(self, prompt: Sequence[int]) -> None:
        self._tokens = []
        self._follows = [{} for _ in range(self.min_ngram, self.max_ngram + 1)]
        self._extend(prompt)

    def propose(self, sequence: Sequence[int], gamma: int, sampling: SamplingParams,
                generator: torch.Generator, allowed: Allowed | None = None) -> Proposal:
        """Up to γ tokens copied from the sequence (see :meth:`lookup`), q one-hot on each; no model call.

        Example: sequence [1, 2, 3, 4, 2, 3], γ = 3, n-grams of 2..3 tokens (the default). The
        3-gram (4, 2, 3) never occurred before; the 2-gram (2, 3) did, at positions 1..2, followed
        by 4, 2, 3. So::

            >>> drafter = PromptLookupDrafter(vocab_size=5)
            >>> draft = drafter.propose([1, 2, 3, 4, 2, 3], 3, SamplingParams(), torch.Generator())
            >>> draft.tokens, draft.probs.argmax(dim=1).tolist(), draft.calls
            ([4, 2, 3], [4, 2, 3], 0)

        ``draft.probs`` is ``[3, 5]``, one-hot on 4, 2 and 3 (whatever the sampling settings). The
        copy may read what it has just copied: [1, 2, 1, 2] with γ = 3 proposes [1, 2, 1]; a
        sequence whose last 2 tokens never occurred before, e.g. [1, 2, 3, 4], proposes [].
        """
        self._catch_up(sequence)
        tokens = self.lookup(gamma)
        if allowed is not None:  # under a constraint: the guesses up to the first it does not allow
            kept = 0
            while kept < len(tokens) and bool(allowed(tokens[:kept])[tokens[kept]]):
                kept += 1
            tokens = tokens[:kept]
        return Proposal(tokens, one_hot_rows(tokens, self.vocab_size, self.device, self.dtype), calls=0)

    def commit(self, length: int) -> None:
        # Only verified tokens are ever indexed (drafts are not), so the index never holds
        # rejected tokens; it only rebuilds if the sequence got shorter (a new text).
        if length < len(self._tokens):
            self.begin(self._tokens[:length])

    def lookup(self, gamma: int) -> list[int]:
        """Up to γ tokens copied after the latest earlier occurrence of the longest matching suffix."""
        tokens = self._tokens
        for n in range(min(self.max_ngram, len(tokens)), self.min_ngram - 1, -1):
            start = self._follows[n - self.min_ngram].get(tuple(tokens[-n:]))
            if start is not None:
                return copy_from(tokens, start, gamma)
        return []

    def _catch_up(self, sequence: Sequence[int]) -> None:
        known = len(self._tokens)
        tail = list(sequence[max(0, known - self.max_ngram) : known])
        if len(sequence) < known or tail != self._tokens[-self.max_ngram :]:
            self.begin(sequence)  # a different text than the one indexed: start over
        else:
            self._extend(sequence[known:])

    def _extend(self, new: Sequence[int]) -> None:
        """Append tokens; each new token is the continuation of the n-grams that end just before it."""
        tokens = self._tokens
        for token in new:
            position = len(tokens)
            for n in range(self.min_ngram, min(self.max_ngram, position) + 1):
                self._follows[n - self.min_ngram][tuple(tokens[position - n : position])] = position
            tokens.append(int(token))


def copy_from(tokens: list[int], start: int, gamma: int) -> list[int]:
    """tokens[start:start + γ], where the copy may read the tokens it has just copied."""
    out: list[int] = []
    length = len(tokens)
    for i in range(gamma):
        j = start + i
        out.append(tokens[j] if j < length else out[j - length])
    return out
