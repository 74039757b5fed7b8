"""A language model (a small LM, an n-gram table) as the drafter: q is its adjusted distribution."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..checks import check_int
from ..constraint import NoAllowedMass, mask_logits
from ..models.base import LanguageModel
from ..rule import sample
from ..sampling import SamplingParams, probs_from_logits
from .base import Allowed, Drafter, Proposal

DEFAULT_DRAFT_WINDOW = 1024  # on a 3,044-token prompt: α 0.755 vs 0.692 reading all (benchmarks/draft_window.py)
MIN_DRAFT_WINDOW = 16
# A reply that must be tool calls (tool_choice required or a named function): short, its structure the grammar's (the
# same mask on q as on p), its values from the last message. Reading a 200-450-token tool prompt was a quarter of such
# a request's time; 64 tokens: tool answers 1.21x -> 1.67x llama-server's (docs/speed.md, 2026-12-06, AMD EPYC).
DEFAULT_CALL_DRAFT_WINDOW = 64


class ModelDrafter:
    """A small language model as the draft: up to γ sequential calls, each one token.

    ``stop_below``: stop drafting early after a token the draft itself gave probability below
    this (transformers' "assistant confidence threshold"). How many tokens get drafted then
    depends only on the draft's own draws, never on the target, so each position's output still
    has exactly the target's distribution (the sequence-level tests cover it); it saves the draft
    calls and verification rows that a likely rejection would waste.
    """

    reads_prompt = True

    def __init__(self, model: LanguageModel, stop_below: float | None = None, window: int | None = None,
                 start: int = 0) -> None:
        if stop_below is not None and not 0.0 <= stop_below < 1.0:
            raise ValueError(f"stop_below={stop_below!r} is invalid: must be in [0, 1) or None (off)")
        if window is not None:
            check_int("draft_window", window, MIN_DRAFT_WINDOW, note=" (prompt tokens the draft reads) or None (all)")
        check_int("draft_start", start, 0, note=" (prompt tokens the draft skips at the start)")
        self.model, self.window, self.start = model, window, start
        self.offset = 0  # sequence positions before the draft's window (it never reads them)
        self.vocab_size = model.vocab_size
        self.device = model.device
        self.stop_below = stop_below
        self.name = str(getattr(model, "name", type(model).__name__))

    def begin(self, prompt: Sequence[int]) -> None:
        # ``start``: what the draft never reads (a tool declaration; it still reads at least one prompt token)
        self.offset = max(window_offset(len(prompt) - 1, self.window), min(self.start, max(len(prompt) - 2, 0)))
        self.model.prefill(list(prompt)[self.offset : -1])

    def propose(self, sequence: Sequence[int], gamma: int, sampling: SamplingParams,
                generator: torch.Generator, allowed: Allowed | None = None) -> Proposal:
        """Up to γ tokens drawn one per model call from the adjusted q (argmax when greedy).

        Example: a bigram draft over 3 tokens with rows 0 → (0.1, 0.9, 0), 1 → (0, 0.2, 0.8),
        2 → (1, 0, 0); after ``begin([0])``, sequence [0], γ = 2:

        - greedy (temperature 0): tokens [1, 2], probs one-hot on 1 then on 2, calls 2;
        - temperature 1: probs row 1 is (0.1, 0.9, 0), row 2 is the table row of the token drawn
          first (0 → (0.1, 0.9, 0), 1 → (0, 0.2, 0.8)); tokens are draws from those rows, calls 2
          (fewer tokens and calls only when ``stop_below`` stops it early).
        """
        # Catch up on the tokens the draft has not read yet (the target's last token, and after
        # a fully accepted round also the last draft), then draft one token per call.
        logits = self.model.score(list(sequence[self.offset + self.model.length :]))[-1]  # [vocab]
        calls = 1
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(gamma):
            if allowed is not None:  # the constraint's mask at this position, as the target's row gets it
                try:
                    logits = mask_logits(logits, allowed(tokens))
                except NoAllowedMass:  # every allowed token is past a cut head: the target draws this one
                    break
            q = probs_from_logits(logits, sampling)  # [vocab]
            token = int(q.argmax()) if sampling.greedy else sample(q, generator)
            tokens.append(token)
            rows.append(q)
            if self.stop_below is not None and float(q[token]) < self.stop_below:
                break
            if i + 1 < gamma:
                logits = self.model.score([token])[-1]
                calls += 1
        probs = torch.stack(rows) if rows else logits.new_zeros(0, self.vocab_size, dtype=torch.float32)
        return Proposal(tokens, probs, calls=calls)

    def commit(self, length: int) -> None:
        # The cache may hold rejected drafts; keep at most the sequence minus its last token.
        self.model.trim(min(self.model.length, length - 1 - self.offset))


def window_offset(prompt_length: int, window: int | None) -> int:
    """Where a draft that reads at most ``window`` prompt tokens starts: on a grid of window/4, so that a
    longer prompt that starts the same way (a follow-up question) starts its window at the same place and
    the prefix cache still serves it. The draft then reads between 3/4 of the window and all of it.

    >>> window_offset(3000, 1024), window_offset(3100, 1024), window_offset(500, 1024)
    (2048, 2304, 0)
    """
    if window is None or prompt_length <= window:
        return 0
    step = max(window // 4, 1)
    return -(-(prompt_length - window) // step) * step


def as_drafter(draft) -> Drafter:
    """A LanguageModel becomes a ModelDrafter; a Drafter is used as it is."""
    if hasattr(draft, "propose"):
        return draft
    return ModelDrafter(draft)
