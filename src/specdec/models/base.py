"""The LanguageModel protocol every backend implements, and its shared input checks.

A model keeps its own cache of the tokens it has seen. Three verbs are all the decode loops use:

- ``prefill(tokens)``: forget everything, then read ``tokens`` (possibly none) into the cache;
- ``score(tokens)``: append k tokens in one call and return k rows of next-token logits,
  row j being the logits after ``tokens[j]`` (``[k, vocab]``);
- ``trim(length)``: roll the cache back to its first ``length`` tokens (mlx-lm's ``trim``).

Logits (not probabilities) come back so that one sampling transform (``specdec.sampling``) turns
target and draft outputs into p and q the same way. A zero-probability token is ``-inf``.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class LanguageModel(Protocol):
    vocab_size: int
    max_length: int | None  # the context window in tokens; None = unbounded
    device: torch.device

    @property
    def length(self) -> int:
        """Tokens currently in the cache."""
        ...

    def prefill(self, tokens: Sequence[int]) -> None: ...

    def score(self, tokens: Sequence[int]) -> torch.Tensor:  # → [len(tokens), vocab] logits
        ...

    def trim(self, length: int) -> None: ...


def check_prompt(model: LanguageModel, prompt: Sequence[int], max_new_tokens: int, role: str = "model") -> list[int]:
    """Validate a prompt against a model before any work is done; return it as a list of ints."""
    tokens = [int(t) for t in prompt]
    if not tokens:
        raise ValueError("prompt is empty: give at least 1 token")
    bad = next((t for t in tokens if not 0 <= t < model.vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt token {bad} is outside the {role}'s vocabulary: ids must be in [0, {model.vocab_size - 1}]")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} is invalid: must be an integer >= 1")
    limit = model.max_length
    if limit is not None and len(tokens) + max_new_tokens > limit:
        raise ValueError(
            f"prompt of {len(tokens)} tokens + max_new_tokens={max_new_tokens} exceeds the {role}'s "
            f"context of {limit} tokens: prompt length + max_new_tokens must be <= {limit}"
        )
    return tokens


def check_trim(model: LanguageModel, length: int) -> None:
    if not 0 <= length <= model.length:
        raise ValueError(f"cannot trim to {length} tokens: the cache holds {model.length}, length must be in [0, {model.length}]")
