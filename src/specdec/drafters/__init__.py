"""Drafters: anything that proposes up to γ tokens together with the q each was drawn from.

- ``base``: the ``Drafter`` protocol and ``Draft``;
- ``model``: ``ModelDrafter``, any LanguageModel (a small LM, an n-gram table) drafting token by token;
- ``lookup``: ``PromptLookupDrafter``, copying from the context (q one-hot on the guess);
- ``composite``: ``CompositeDrafter``, one drafter, another when the first has nothing;
- ``spec``: the ``--draft`` forms: ``parse_draft`` and ``make_drafter``.
"""

from .base import Draft, Drafter, drafter_name, one_hot_rows
from .composite import CompositeDrafter
from .lookup import PromptLookupDrafter
from .model import ModelDrafter, as_drafter
from .spec import DRAFT_FORMS, DraftSpec, make_drafter, needs_draft_model, parse_draft

__all__ = [
    "DRAFT_FORMS", "CompositeDrafter", "Draft", "DraftSpec", "Drafter", "ModelDrafter", "PromptLookupDrafter",
    "as_drafter", "drafter_name", "make_drafter", "needs_draft_model", "one_hot_rows", "parse_draft",
]
