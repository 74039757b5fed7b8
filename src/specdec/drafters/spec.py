"""Choosing a drafter by name: the ``--draft`` forms, parsed into a ``DraftSpec`` and built."""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass

import torch

from ..models.base import LanguageModel
from ..models.ngram import NgramModel, read_header
from .base import Drafter
from .composite import CompositeDrafter
from .lookup import PromptLookupDrafter
from .model import ModelDrafter

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
