"""A LanguageModel wrapper that records every logits row it returns (for measuring β on the target's own text)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import NO_ABILITIES, LanguageModel


class RecordingModel:
    """A LanguageModel that passes every call through and keeps the logits rows it returned."""

    abilities = NO_ABILITIES  # the three verbs only, whatever the wrapped model offers

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self.vocab_size, self.max_length, self.device = model.vocab_size, model.max_length, model.device
        self.rows: list[torch.Tensor] = []

    @property
    def length(self) -> int:
        return self.model.length

    def prefill(self, tokens: Sequence[int]) -> int:
        return self.model.prefill(tokens)

    def score(self, tokens: Sequence[int]) -> torch.Tensor:
        logits = self.model.score(tokens)  # [k, vocab]
        self.rows.extend(logits.detach().clone().unbind(0))
        return logits

    def trim(self, length: int) -> None:
        self.model.trim(length)
