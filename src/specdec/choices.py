"""What a user chooses by name: the drafter (``--draft``) and γ (``--gamma``) forms, parsed and built.

One table, :data:`FORM_TABLE`, drives the drafter parsing, the ``--help`` text and the error
message (as llama.cpp's ``common_speculative_type_from_name_map`` does for its speculative types);
:data:`GAMMA_FORMS` and :data:`MAX_GAMMA` do the same for γ. This module sits above the algorithm
(``drafters``, ``gamma``) and the model files (``loading``): it turns a name into a drafter or a γ
policy, so neither of those floors needs to know about names, files or paths.

Terms: a *drafter form* (:class:`DrafterForm`) is a parsed ``--draft`` value; a row of the table
(:class:`FormRow`) is one name a form may take; the *draft model* is the small language model a
``model`` form drafts with. :func:`parse_draft` reads an *operator's* value (the CLI's ``--draft``):
it opens the files a value names, and its hints look for one when a value is not a form. A
*client's* value (an HTTP request's) goes to :func:`parse_fileless_draft` instead, which only
compares it with the names of the forms that name no file (:data:`FILELESS_FORMS`), so a client
never makes the server look at a path.
Every value shown in an error is quoted with ``repr`` (a client's text may hold anything).
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
from dataclasses import dataclass

import torch

from .checks import is_int
from .drafters import CompositeDrafter, Drafter, ModelDrafter, PromptLookupDrafter
from .drafters.base import NoDraft
from .drafters.history import HistoryDrafter
from .drafters.history_table import HistoryTable, HistoryView, as_view
from .gamma import AdaptiveGamma, FixedGamma, GammaPolicy, HeuristicGamma, is_policy
from .models.base import LanguageModel
from .models.ngram import NgramModel, read_header

MAX_GAMMA = 64  # the largest fixed γ a run or a request may ask for: more than any draft sustains
GAMMA_FORMS = f"an integer in [1, {MAX_GAMMA}], 'auto' (learned online) or 'heuristic' (transformers' schedule)"


@dataclass(frozen=True)
class FormRow:
    """One row of the drafter table: ``name[:argument]`` and what it drafts with."""

    name: str  # model, lookup, ngram, ...
    argument: str | None  # what follows ':' (None: nothing may follow)
    description: str
    source: str | None  # "model", "ngram", or None (prompt lookup)
    order: int | None = None  # an n-gram alias that checks the table's order

    @property
    def usage(self) -> str:
        return self.name if self.argument is None else f"{self.name}:{self.argument}"


LOOKUP_PREFIX = "lookup+"
HISTORY_PREFIX = "history+"
FORM_TABLE: tuple[FormRow, ...] = (
    FormRow("model", None, "the draft model: --draft-model PATH, else the default pair's "
                "Qwen2.5-Coder-0.5B-Instruct (specdec[default-models]); it must share the target's tokenizer", "model"),
    FormRow("lookup", None, "prompt lookup: copies what followed the latest earlier occurrence of the text's "
                "last 3..1 tokens (no model, q one-hot)", None),
    FormRow("ngram", "FILE", "an n-gram table written by `specdec fit-draft`", "ngram"),
    FormRow("unigram", "FILE", "ngram:FILE whose table must have order 1", "ngram", order=1),
    FormRow("bigram", "FILE", "ngram:FILE whose table must have order 2", "ngram", order=2),
    FormRow("trigram", "FILE", "ngram:FILE whose table must have order 3", "ngram", order=3),
    FormRow("lookup+model", None, "prompt lookup, else the draft model", "model"),
    FormRow("lookup+ngram", "FILE", "prompt lookup, else the n-gram table (lookup+ goes before any form "
                "above but lookup)", "ngram"),
    FormRow("none", None, "no draft: every round is one plain target step (plain decoding, the reference)", None),
    FormRow("history", None, "drafts from history: copies what followed the longest earlier match (>= 3 tokens) of "
                "the text's end in this request and in earlier requests' texts (the server's table, "
                "--history-file; no model, q one-hot)", None),
    FormRow("history+lookup", None, "history, else prompt lookup", None),
    FormRow("history+model", None, "history, else the draft model", "model"),
    FormRow("history+lookup+model", None, "history, else prompt lookup, else the draft model (history+ goes "
                "before any form above but history)", "model"),
)
_BASE_FORMS = {form.name: form for form in FORM_TABLE
               if not form.name.startswith((LOOKUP_PREFIX, "history")) and form.name != "none"}
FORM_USAGES = tuple(form.usage for form in FORM_TABLE)  # the accepted forms, in words
FILELESS_FORMS = tuple(form.name for form in FORM_TABLE if form.argument is None)  # model, lookup, history, ...


def drafter_forms_help(forms=FORM_TABLE) -> str:
    """The table as help text: ``name[:ARG]`` = description; ..."""
    return "; ".join(f"{form.usage} = {form.description}" for form in forms)


@dataclass(frozen=True)
class DrafterForm:
    """A *drafter form*: a parsed ``--draft`` value; optional prompt lookup, then a model or an n-gram file."""

    text: str
    lookup: bool  # prompt lookup first
    source: str | None  # "model", "ngram", or None (prompt lookup alone)
    path: str | None  # the n-gram file, or the draft model's path (None: the pair's default draft)
    order: int | None = None  # the n-gram order the form's name promises (unigram/bigram/trigram)
    row: str = ""  # the table row's name without history+ and lookup+ (model, ngram, bigram, ...)
    history: bool = False  # drafts from history first (history+...)

    @property
    def needs_draft_model(self) -> bool:
        return self.source == "model"


def parse_draft(value: str | DrafterForm | None) -> DrafterForm:
    """Read a ``--draft`` value (None = ``model``); a bad one is a ValueError naming the forms.

    The forms are :data:`FORM_TABLE`; ``lookup+`` goes before any of them but ``lookup``, ``history+`` before
    any of them but ``history``.
    ``model:PATH`` names the draft model inline (the CLI's ``--draft-model PATH`` becomes it,
    see :func:`with_draft_model`); PATH must be a model ``--target`` accepts.
    """
    if isinstance(value, DrafterForm):
        return value
    text = "model" if value is None else str(value)
    value = text.strip()
    if value in ("history", "none"):
        return DrafterForm(text, False, None, None, row=value, history=value == "history")
    if value.startswith(HISTORY_PREFIX):
        rest = value[len(HISTORY_PREFIX):].strip()
        if not rest or rest == "history" or rest.startswith(HISTORY_PREFIX):
            raise ValueError(_bad_draft(text, "nothing usable after 'history+'"))
        return dataclasses.replace(_parse_plain(text, rest), history=True)
    return _parse_plain(text, value)


def _parse_plain(text: str, value: str) -> DrafterForm:
    """``value``, a form without history+, parsed (``text``: the whole value, for the messages)."""
    if value == "lookup":
        return DrafterForm(text, True, None, None, row="lookup")
    lookup = value.startswith(LOOKUP_PREFIX)
    rest = value[len(LOOKUP_PREFIX):] if lookup else value
    if not rest or rest == "lookup" or rest.startswith(LOOKUP_PREFIX):
        raise ValueError(_bad_draft(text, "nothing usable after 'lookup+'" if lookup else "it is empty"))
    name, colon, argument = rest.partition(":")
    form = _BASE_FORMS.get(name)
    if form is None:
        if os.path.isfile(rest) and zipfile.is_zipfile(rest) and _is_ngram_file(rest):
            raise ValueError(_bad_draft(text, f"{rest!r} is an n-gram table: write ngram:{rest!r}"))
        why = f"unknown form {name!r}"
        if os.path.exists(rest) or "/" in rest or rest.lower().endswith(".gguf"):
            why += f"; a draft model goes to --draft-model {rest!r}"
        raise ValueError(_bad_draft(text, why))
    if form.source == "model":
        if not colon:
            return DrafterForm(text, lookup, "model", None, row="model")
        if not argument:
            raise ValueError(_bad_draft(text, "'model:' needs a model path"))
        from .loading.locate import locate_model

        locate_model(argument, "draft", assemble=False)  # a missing or foreign model fails here, by name
        return DrafterForm(text, lookup, "model", argument, row="model")
    if form.argument is None:
        if colon:
            raise ValueError(_bad_draft(text, f"'{name}' takes no ':' argument"))
        return DrafterForm(text, lookup, form.source, None, row=name)
    if not argument:
        raise ValueError(_bad_draft(text, f"'{name}:' needs a file"))
    try:
        meta = read_header(argument)
    except ValueError as err:
        raise ValueError(_bad_draft(text, str(err))) from None
    if form.order is not None and meta["order"] != form.order:
        raise ValueError(_bad_draft(text, f"n-gram file {argument!r} has order {meta['order']}, not {form.order} "
                                    f"({name}): write ngram:{argument!r}"))
    return DrafterForm(text, lookup, "ngram", argument, order=form.order, row=name)


def parse_fileless_draft(value: object) -> DrafterForm | None:
    """``value`` parsed when it is one of :data:`FILELESS_FORMS` (white space around it ignored), else
    None. Nothing but that comparison happens first: a value from a client never reaches the
    filesystem, nor a hint that would tell whether some path exists."""
    name = value.strip() if isinstance(value, str) else None
    return parse_draft(name) if name in FILELESS_FORMS else None


def with_draft_model(value: str | None, draft_model: str | None) -> str | None:
    """A ``--draft`` value with ``--draft-model PATH`` folded in: ``model`` → ``model:PATH``
    (``lookup+model`` likewise); unchanged when there is no path or the drafter needs no model."""
    if draft_model is None:
        return value
    form = parse_draft(value)
    if not form.needs_draft_model:
        return value
    if form.path is not None and form.path != draft_model:
        raise ValueError(f"--draft {form.text!r} names a draft model, and so does --draft-model {draft_model!r}: "
                         "give it once")
    return f"{HISTORY_PREFIX if form.history else ''}{LOOKUP_PREFIX if form.lookup else ''}model:{draft_model}"


def _is_ngram_file(path: str) -> bool:
    try:
        read_header(path)
    except ValueError:
        return False
    return True


def needs_draft_model(value: str | None) -> bool:
    """Whether the ``--draft`` value needs a draft language model loaded (not lookup / n-gram alone)."""
    return parse_draft(value).needs_draft_model


def make_drafter(value: str | DrafterForm | None, *, draft_model: LanguageModel | None, vocab_size: int,
                 device, stop_below: float | None = None, window: int | None = None, start: int = 0,
                 dtype: torch.dtype = torch.float32, history: HistoryTable | HistoryView | None = None) -> Drafter:
    """The drafter a ``--draft`` value names. ``draft_model``: the loaded draft (needed by
    ``model`` forms); ``vocab_size`` / ``device``: the target's; ``stop_below`` goes to model drafts,
    ``window`` (the prompt tokens it reads, ``drafters.model.window_offset``) and ``start`` (those it skips at the
    start) to a draft model; ``history``: the
    table (its tenant "") or a tenant's view a ``history`` form drafts from besides the request itself (None:
    the request alone)."""
    form = value if isinstance(value, DrafterForm) else parse_draft(value)
    base = _base_drafter(form, draft_model=draft_model, vocab_size=vocab_size, device=device,
                         stop_below=stop_below, window=window, start=start, dtype=dtype)
    if form.row == "none":
        return NoDraft(vocab_size)
    if not form.history:
        return base
    first = HistoryDrafter(vocab_size, as_view(history), device=device, dtype=dtype)
    return first if base is None else CompositeDrafter(first, base)


def _base_drafter(form: DrafterForm, *, draft_model, vocab_size, device, stop_below, window, start,
                  dtype) -> Drafter | None:
    """The drafter of a form without its history+ (None for ``history`` alone)."""
    drafter: Drafter | None = None
    if form.source == "model":
        if draft_model is None:
            raise ValueError(f"--draft {form.text!r} drafts with a model, but no draft model was loaded")
        drafter = ModelDrafter(draft_model, stop_below=stop_below, window=window, start=start)
    elif form.source == "ngram":
        table = NgramModel.load(form.path, vocab_size=vocab_size, device=device, dtype=dtype)
        table.name = f"order-{table.order} n-gram {form.path}"
        drafter = ModelDrafter(table, stop_below=stop_below)
    if not form.lookup:
        return drafter
    lookup = PromptLookupDrafter(vocab_size, device=device, dtype=dtype)
    return lookup if drafter is None else CompositeDrafter(lookup, drafter)


def _bad_draft(text: str, why: str) -> str:
    return f"--draft {text!r} is invalid ({why}); accepted forms: {', '.join(FORM_USAGES)}"


def parse_gamma(value: int | str) -> int | str:
    """A --gamma value as given: an integer in [1, MAX_GAMMA] (or its digits) → int; 'auto' /
    'heuristic' kept (any case, white space around ignored); anything else a ValueError naming the forms."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("auto", "heuristic"):
            return text
        if text.isdigit():
            value = int(text)
        else:
            raise ValueError(f"gamma={value!r} is invalid: must be {GAMMA_FORMS}")
    if not is_int(value) or not 1 <= value <= MAX_GAMMA:
        raise ValueError(f"gamma={value!r} is invalid: must be {GAMMA_FORMS}")
    return value


def make_policy(value: int | str | GammaPolicy, **options) -> GammaPolicy:
    """A fresh policy for one generation: an int (or its digits) → FixedGamma, 'auto' →
    AdaptiveGamma, 'heuristic' → HeuristicGamma (``options`` go to the latter two); a policy
    is returned as it is."""
    if is_policy(value):
        return value
    gamma = parse_gamma(value)
    if gamma == "auto":
        return AdaptiveGamma(**options)
    if gamma == "heuristic":
        return HeuristicGamma(**options)
    return FixedGamma(gamma)
