"""Drafters: anything that proposes up to γ tokens together with the q each was drawn from.

- ``base``: the ``Drafter`` protocol and ``Proposal``;
- ``model``: ``ModelDrafter``, any LanguageModel (a small LM, an n-gram table) drafting token by token;
- ``lookup``: ``PromptLookupDrafter``, copying from the context (q one-hot on the guess);
- ``composite``: ``CompositeDrafter``, one drafter, another when the first has nothing;
- ``history``: ``HistoryDrafter``, copying from this request and earlier ones (suffix matches, q one-hot), over
  ``history_table``'s ``HistoryTable`` (bounded, least recently used evicted, per tenant, saved to a file).

A drafter given by name (``--draft``) is parsed and built in :mod:`specdec.choices`.
"""

from .base import Drafter, Proposal, one_hot_rows
from .composite import CompositeDrafter
from .history import HistoryDrafter, HistorySettings
from .history_table import HistoryFileError, HistoryTable
from .lookup import PromptLookupDrafter
from .model import ModelDrafter, as_drafter

__all__ = [
    "CompositeDrafter", "Proposal", "Drafter", "HistoryDrafter", "HistoryFileError", "HistorySettings",
    "HistoryTable", "ModelDrafter", "PromptLookupDrafter", "as_drafter", "one_hot_rows",
]
