"""BigramModel: a table model whose next-token distribution depends on the last token only.

The paper's cheapest draft (spec §3.6, α ≈ 0.2 on EnDe), and the exact, fast target of the
sequence-level tests: the probability of any whole sequence is a product of table entries.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .base import Abilities, check_trim


class BigramModel:
    """``probs[i]`` is the next-token distribution after token i (a row-stochastic ``[V, V]``)."""

    abilities = Abilities(switch_state=True)

    def __init__(self, probs, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float64) -> None:
        table = torch.as_tensor(np.asarray(probs, dtype=np.float64))
        if table.ndim != 2 or table.shape[0] != table.shape[1] or table.shape[0] == 0:
            raise ValueError(f"probs must be a square [V, V] table, got shape {tuple(table.shape)}")
        ones = torch.ones(table.shape[0], dtype=table.dtype)
        if bool((table < 0).any()) or not torch.allclose(table.sum(1), ones, atol=1e-6):
            raise ValueError("probs must be row-stochastic: entries >= 0 and every row summing to 1")
        self.device = torch.device(device)
        self.probs = table.to(device=self.device, dtype=dtype)  # [V, V]
        self.log_probs = torch.log(self.probs)  # [V, V], -inf where the table is 0
        self.vocab_size = int(table.shape[0])
        self.max_length: int | None = None
        self._tokens: list[int] = []

    @classmethod
    def fit(cls, token_ids: Sequence[int], vocab_size: int, smoothing: float = 1.0, **kwargs) -> BigramModel:
        """Count-train from a corpus: probs[i, j] ∝ count(i → j) + smoothing."""
        if vocab_size < 1:
            raise ValueError(f"vocab_size={vocab_size} is invalid: must be >= 1")
        if smoothing < 0:
            raise ValueError(f"smoothing={smoothing} is invalid: must be >= 0")
        ids = np.asarray(list(token_ids), dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"token ids must be in [0, {vocab_size - 1}], found {int(ids.min())}..{int(ids.max())}")
        counts = np.full((vocab_size, vocab_size), float(smoothing))
        if ids.size > 1:
            np.add.at(counts, (ids[:-1], ids[1:]), 1.0)
        totals = counts.sum(1, keepdims=True)
        empty = totals[:, 0] == 0  # a token never followed by anything, with no smoothing
        counts[empty] = 1.0
        return cls(counts / counts.sum(1, keepdims=True), **kwargs)

    @property
    def length(self) -> int:
        return len(self._tokens)

    def prefill(self, tokens: Sequence[int]) -> int:
        self._tokens = [int(t) for t in tokens]
        return 0

    def score(self, tokens: Sequence[int]) -> torch.Tensor:
        """[k, vocab] logits (log-probabilities) after each of the k appended tokens."""
        new = [int(t) for t in tokens]
        self._tokens.extend(new)
        if len(new) == 1:  # the common case in a decode loop: a view, no index tensor
            return self.log_probs[new[0] : new[0] + 1]
        return self.log_probs[torch.tensor(new, dtype=torch.long, device=self.device)]

    def trim(self, length: int) -> None:
        check_trim(self, length)
        del self._tokens[length:]

    def state(self) -> list[int]:
        """The sequence state (the cached tokens), to ``restore`` later: one model serving several
        sequences in turn (``specdec serve``) keeps each one's state between its turns."""
        return self._tokens

    def restore(self, state: list[int]) -> None:
        """Make ``state`` (from ``state()``) the current sequence again; ``prefill`` starts a new one."""
        self._tokens = state
