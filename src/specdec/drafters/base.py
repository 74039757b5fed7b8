"""What every drafter is: the ``Drafter`` protocol and the ``Proposal`` it proposes.

A drafter proposes up to γ tokens together with the q each was drawn from; the acceptance rule is
exact for any q the drafted tokens were really drawn from. The decode loop talks to a drafter
through three verbs:

- ``begin(prompt)``: start a new sequence;
- ``propose(sequence, gamma, sampling, generator, allowed=None)`` → ``Proposal`` (tokens ``[n]``, probs
  ``[n, V]``, n ≤ γ), where ``sequence`` is the whole text so far (prompt + output); under a constraint,
  ``allowed(drafts)`` is the ``[V]`` bool mask after the drafts so far (``constraint.DraftMasks.after``): a
  drafter draws each token under the mask at its position (its q is then zero outside it) and proposes only
  allowed tokens;
- ``commit(length)``: after verification, the sequence is ``length`` tokens long and its last
  token came from the target; forget any drafted tokens past the accepted prefix.

A drafter may propose fewer than γ tokens, even none (the round is then a plain target step). It states its
``name`` (in words, for reports) and whether ``begin`` makes a language model read the prompt
(``reads_prompt``: a long prompt's first token is then drawn by the target alone, before the draft reads;
``decode.FIRST_TOKEN_ALONE_FROM``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from ..sampling import SamplingParams

Allowed = Callable[[Sequence[int]], torch.Tensor]  # drafts so far → [vocab] bool mask of the next token


@dataclass(frozen=True)
class Proposal:
    """What a drafter proposes for one round: the tokens and the q each was drawn from."""

    tokens: list[int]  # [n] drafted tokens, n ≤ γ
    probs: torch.Tensor  # [n, vocab] the q each drafted token was drawn from
    calls: int  # model calls spent producing them (0 for a model-free guesser)


class Drafter(Protocol):
    vocab_size: int
    name: str
    reads_prompt: bool  # begin() has a language model read the prompt (not a lookup's index)

    def begin(self, prompt: Sequence[int]) -> None: ...

    def propose(self, sequence: Sequence[int], gamma: int, sampling: SamplingParams,
                generator: torch.Generator, allowed: Allowed | None = None) -> Proposal: ...

    def commit(self, length: int) -> None: ...


class NoDraft:
    """The drafter that proposes nothing (``--draft none``): every round is one plain target step, so a run is
    plain decoding with the target alone, through the same loop (the reference the others are measured by)."""

    name, reads_prompt = "none (the target alone)", False

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def propose(self, sequence: Sequence[int], gamma: int, sampling: SamplingParams,
                generator: torch.Generator, allowed: Allowed | None = None) -> Proposal:
        return Proposal([], torch.empty(0, self.vocab_size), calls=0)

    def commit(self, length: int) -> None:
        pass


def one_hot_rows(tokens: Sequence[int], vocab_size: int, device, dtype=torch.float32) -> torch.Tensor:
    """q of a deterministic guesser: ``[len(tokens), vocab]``, one-hot on each guessed token.

    On the CPU the rows are built in numpy: single-threaded, so no OpenMP hand-off for a fill
    that takes microseconds (on a busy machine torch's parallel fill of 150k entries can wait
    milliseconds for a second thread).
    """
    device = torch.device(device)
    if device.type == "cpu" and dtype in (torch.float32, torch.float64):
        rows = np.zeros((len(tokens), vocab_size), dtype=np.float32 if dtype == torch.float32 else np.float64)
        rows[np.arange(len(tokens)), np.asarray(tokens, dtype=np.int64)] = 1.0
        return torch.from_numpy(rows)
    index = torch.tensor(list(tokens), dtype=torch.long, device=device).unsqueeze(1)  # [n, 1]
    return torch.zeros(len(tokens), vocab_size, device=device, dtype=dtype).scatter_(1, index, 1.0)
