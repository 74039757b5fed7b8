"""Drafters: anything that proposes up to γ tokens together with the q each was drawn from.

The acceptance rule is exact for any q the drafted tokens were really drawn from, so a drafter
can be a small model (q = its adjusted distribution) or a deterministic guesser (q one-hot on
its guess). The decode loop talks to a drafter through three verbs:

- ``begin(prompt)``: start a new sequence;
- ``propose(sequence, gamma, sampling, generator)`` → ``Draft`` (tokens ``[n]``, probs ``[n, V]``,
  n ≤ γ), where ``sequence`` is the whole text so far (prompt + output);
- ``commit(length)``: after verification, the sequence is ``length`` tokens long and its last
  token came from the target; forget any drafted tokens past the accepted prefix.

A drafter may propose fewer than γ tokens, even none (the round is then a plain target step).
Here: ``ModelDrafter`` (any LanguageModel, including an ``ngram.NgramModel`` table),
``CompositeDrafter`` (one drafter, another when the first has nothing); ``lookup`` has prompt
lookup. ``make_drafter`` builds one from a ``--draft`` value (``parse_draft`` lists the forms).
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .models.base import LanguageModel
from .ngram import NgramModel, read_header
from .rule import sample
from .sampling import SamplingParams, probs_from_logits


@dataclass(frozen=True)
class Draft:
    tokens: list[int]  # [n] drafted tokens, n ≤ γ
    probs: torch.Tensor  # [n, vocab] the q each drafted token was drawn from
    calls: int  # model calls spent producing them (0 for a model-free guesser)


class Drafter(Protocol):
    vocab_size: int

    def begin(self, prompt: Sequence[int]) -> None: ...

    def propose(self, sequence: Sequence[int], gamma: int, sampling: SamplingParams, generator: torch.Generator) -> Draft: ...

    def commit(self, length: int) -> None: ...


class ModelDrafter:
    """A small language model as the draft: up to γ sequential calls, each one token.

    ``stop_below``: stop drafting early after a token the draft itself gave probability below
    this (transformers' "assistant confidence threshold"). How many tokens get drafted then
    depends only on the draft's own draws, never on the target, so each position's output still
    has exactly the target's distribution (the sequence-level tests cover it); it saves the draft
    calls and verification rows that a likely rejection would waste.
    """

    def __init__(self, model: LanguageModel, stop_below: float | None = None) -> None:
        if stop_below is not None and not 0.0 <= stop_below < 1.0:
            raise ValueError(f"stop_below={stop_below!r} is invalid: must be in [0, 1) or None (off)")
        self.model = model
        self.vocab_size = model.vocab_size
        self.device = model.device
        self.stop_below = stop_below
        self.name = str(getattr(model, "name", type(model).__name__))

    def begin(self, prompt: Sequence[int]) -> None:
        self.model.prefill(list(prompt)[:-1])

    def propose(self, sequence: Sequence[int], gamma: int, sampling: SamplingParams, generator: torch.Generator) -> Draft:
        # Catch up on the tokens the draft has not read yet (the target's last token, and after
        # a fully accepted round also the last draft), then draft one token per call.
        logits = self.model.score(list(sequence[self.model.length :]))[-1]  # [vocab]
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(gamma):
            q = probs_from_logits(logits, sampling)  # [vocab]
            token = int(q.argmax()) if sampling.greedy else sample(q, generator)
            tokens.append(token)
            rows.append(q)
            if self.stop_below is not None and float(q[token]) < self.stop_below:
                break
            if i + 1 < gamma:
                logits = self.model.score([token])[-1]
        return Draft(tokens, torch.stack(rows), calls=len(tokens))

    def commit(self, length: int) -> None:
        # The cache may hold rejected drafts; keep at most the sequence minus its last token.
        self.model.trim(min(self.model.length, length - 1))


def as_drafter(draft) -> Drafter:
    """A LanguageModel becomes a ModelDrafter; a Drafter is used as it is."""
    if hasattr(draft, "propose"):
        return draft
    return ModelDrafter(draft)


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


class CompositeDrafter:
    """Tries ``first`` (prompt lookup, say); when it proposes nothing, ``fallback`` drafts.

    Both see every round's commit, so the fallback's cache stays in step with the sequence (a
    model drafter reads the tokens it skipped at its next proposal). ``rounds`` counts whose draft
    was used.
    """

    def __init__(self, first: Drafter, fallback: Drafter) -> None:
        if first.vocab_size != fallback.vocab_size:
            raise ValueError(f"composite drafter parts disagree on the vocabulary: {first.vocab_size} vs {fallback.vocab_size}")
        self.first, self.fallback = first, fallback
        self.vocab_size = first.vocab_size
        self.name = f"{_name(first)}, else {_name(fallback)}"
        self.rounds = {"first": 0, "fallback": 0}

    def begin(self, prompt: Sequence[int]) -> None:
        self.first.begin(prompt)
        self.fallback.begin(prompt)
        self.rounds = {"first": 0, "fallback": 0}

    def propose(self, sequence: Sequence[int], gamma: int, sampling: SamplingParams, generator: torch.Generator) -> Draft:
        draft = self.first.propose(sequence, gamma, sampling, generator)
        if draft.tokens:
            self.rounds["first"] += 1
            return draft
        self.rounds["fallback"] += 1
        return self.fallback.propose(sequence, gamma, sampling, generator)

    def commit(self, length: int) -> None:
        self.first.commit(length)
        self.fallback.commit(length)


def _name(drafter) -> str:
    return getattr(drafter, "name", type(drafter).__name__)


# ---------------------------------------------------------------------- choosing a drafter by name

DRAFT_FORMS = ("model", "lookup", "ngram:FILE", "bigram:FILE", "lookup+model", "lookup+ngram:FILE", "a model path or id")


@dataclass(frozen=True)
class DraftSpec:
    """A parsed ``--draft`` value: optional prompt lookup first, then a model or an n-gram file."""

    text: str
    lookup: bool  # prompt lookup first
    source: str | None  # "model", "ngram", or None (prompt lookup alone)
    path: str | None  # the n-gram file, or the draft model's path/id (None: the pair's default draft)

    @property
    def needs_draft_model(self) -> bool:
        return self.source == "model"


def parse_draft(spec: str | None) -> DraftSpec:
    """Read a ``--draft`` value (None = ``model``); a bad one is a ValueError naming the forms.

    Forms: ``model`` (the pair's small draft model), ``lookup`` (prompt lookup), ``ngram:FILE``
    (alias ``bigram:FILE``, a table from ``specdec fit-draft``), ``lookup+model``,
    ``lookup+ngram:FILE``; any other value is a draft model's path or id (``lookup+PATH`` too).
    """
    text = "model" if spec is None else str(spec)
    value = text.strip()
    lookup = value.startswith("lookup+")
    rest = value[len("lookup+") :] if lookup else value
    if value == "lookup":
        return DraftSpec(text, True, None, None)
    if not rest or rest == "lookup" or rest.startswith("lookup+"):
        raise ValueError(_bad_draft(text, "nothing usable after 'lookup+'" if lookup else "it is empty"))
    kind, colon, path = rest.partition(":")
    if kind in ("lookup", "model") and colon:
        raise ValueError(_bad_draft(text, f"'{kind}' takes no ':' argument"))
    if kind in ("ngram", "bigram"):
        if not path:
            raise ValueError(_bad_draft(text, f"'{kind}:' needs a file"))
        try:
            read_header(path)
        except ValueError as err:
            raise ValueError(_bad_draft(text, str(err))) from None
        return DraftSpec(text, lookup, "ngram", path)
    if os.path.isfile(rest) and zipfile.is_zipfile(rest) and _is_ngram_file(rest):
        raise ValueError(_bad_draft(text, f"{rest!r} is an n-gram table: write ngram:{rest}"))
    return DraftSpec(text, lookup, "model", None if rest == "model" else rest)


def _is_ngram_file(path: str) -> bool:
    try:
        read_header(path)
    except ValueError:
        return False
    return True


def needs_draft_model(spec: str | None) -> bool:
    """Whether the ``--draft`` value needs a draft language model loaded (not lookup / n-gram alone)."""
    return parse_draft(spec).needs_draft_model


def make_drafter(spec: str | DraftSpec | None, *, draft_model: LanguageModel | None, vocab_size: int,
                 device, stop_below: float | None = None, dtype: torch.dtype = torch.float32) -> Drafter:
    """The drafter a ``--draft`` value names. ``draft_model``: the loaded draft (needed by
    ``model`` forms); ``vocab_size`` / ``device``: the target's; ``stop_below`` goes to model drafts."""
    from .lookup import PromptLookupDrafter  # lookup builds on this module

    parsed = spec if isinstance(spec, DraftSpec) else parse_draft(spec)
    drafter: Drafter | None = None
    if parsed.source == "model":
        if draft_model is None:
            raise ValueError(f"--draft {parsed.text!r} drafts with a model, but no draft model was loaded")
        drafter = ModelDrafter(draft_model, stop_below=stop_below)
    elif parsed.source == "ngram":
        table = NgramModel.load(parsed.path, vocab_size=vocab_size, device=device, dtype=dtype)
        table.name = f"order-{table.order} n-gram {parsed.path}"
        drafter = ModelDrafter(table, stop_below=stop_below)
    if not parsed.lookup:
        return drafter
    lookup = PromptLookupDrafter(vocab_size, device=device, dtype=dtype)
    return lookup if drafter is None else CompositeDrafter(lookup, drafter)


def _bad_draft(text: str, why: str) -> str:
    return f"--draft {text!r} is invalid ({why}); accepted forms: {', '.join(DRAFT_FORMS)}"
