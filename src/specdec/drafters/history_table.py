"""The history drafter's table: earlier requests' texts, bounded, least recently used evicted, per tenant.

Terms: a *document* is one finished request's text (its prompt and answer, one token list); a *tenant*
is whoever a document belongs to (the server: the API key a request came with, as :func:`tenant_id`, never
the key itself; "" without keys). Each tenant has its own :class:`~specdec.drafters.history.SuffixIndex`,
and a tenant's view (:meth:`HistoryTable.view`) drafts from that tenant's documents only: one client's
text never drafts for another's.

The bound: at most ``budget`` tokens in all, over every tenant. Recording a document past it evicts the
least recently used documents (of any tenant) until the rest fits; a document is *used* when it is recorded
and whenever it supplies a draft. A document longer than the budget keeps its last ``budget`` tokens. A new
document that starts with a stored one of its tenant (the next turn of a conversation re-sends the last
one, answer included) replaces it, and recording a document again only marks it used: the same text is
not stored twice in a row.

The file (:meth:`HistoryTable.save`, :meth:`HistoryTable.load`): the magic line ``specdec-history``, one JSON
line (format, vocabulary size, each document's tenant and length oldest first, the tokens' SHA-256), then
the tokens as little-endian uint32. It is written atomically (a temporary file beside it, then a rename:
never half-written), holds at most the budget, and loading checks every part of it: a bad or corrupt file
is a :class:`HistoryFileError` naming the file and what is wrong. Loading into a smaller budget keeps the
most recently used documents.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from ..cache import write_atomic
from ..checks import check_int
from .history import DEFAULT_SETTINGS, HistorySettings, Match, SuffixIndex

DEFAULT_BUDGET = 262_144  # tokens kept in all (about 33 MB at 126 bytes a token: benchmarks/history_cost.py)
MAX_BUDGET = 1 << 28  # the largest budget accepted (2^28 tokens)
MAGIC = b"specdec-history\n"
FORMAT = 1
MAX_HEADER_BYTES = 64 << 20  # the JSON line's largest size
PREFIX_KEY = 32  # a document is found by its first 32 tokens (all of a shorter one) when a new one continues it
CHUNK = 1 << 20  # tokens read at a time when loading


class HistoryFileError(ValueError):
    """A history file that cannot be read as one (its message names the file and what is wrong)."""


def tenant_id(api_key: str | None) -> str:
    """The tenant of a request made with ``api_key``: 16 hex digits of its SHA-256 ("" without a key). A saved
    table holds these, never the keys."""
    if api_key is None:
        return ""
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()[:16]


class HistoryView:
    """One tenant's part of a table: what a :class:`~specdec.drafters.history.HistoryDrafter` drafts from
    and what a finished request is recorded into."""

    def __init__(self, table: HistoryTable, tenant: str) -> None:
        self.table, self.tenant = table, tenant

    def match(self, context: Sequence[int], limit: int) -> Match | None:
        return self.table.match(self.tenant, context, limit)

    def touch(self, document: int) -> None:
        self.table.touch(document)

    def record(self, tokens: Sequence[int]) -> None:
        self.table.record(self.tenant, tokens)


def as_view(history: HistoryTable | HistoryView | None) -> HistoryView | None:
    """A table's default tenant ("") view, a view as it is, None as it is."""
    return history.view("") if isinstance(history, HistoryTable) else history


class HistoryTable:
    """Earlier texts by tenant, at most ``budget`` tokens in all (see the module). Thread-safe: the server's
    engine drafts and records on its thread while a save may run on another."""

    def __init__(self, vocab_size: int, budget: int = DEFAULT_BUDGET, *,
                 settings: HistorySettings = DEFAULT_SETTINGS) -> None:
        check_int("vocab_size", vocab_size, 1, (1 << 32) - 1)
        check_int("history budget", budget, 1, MAX_BUDGET, note=" (tokens kept)")
        self.vocab_size, self.budget, self.settings = vocab_size, budget, settings
        self._indexes: dict[str, SuffixIndex] = {}
        self._used: OrderedDict[int, str] = OrderedDict()  # document → tenant, least recently used first
        self._starts: dict[tuple[str, tuple[int, ...]], list[int]] = {}  # (tenant, first tokens) → documents
        self._next, self.tokens = 0, 0
        self._lock = threading.RLock()

    def view(self, tenant: str = "") -> HistoryView:
        return HistoryView(self, tenant)

    @property
    def documents(self) -> int:
        return len(self._used)

    def tenants(self) -> list[str]:
        with self._lock:
            return sorted(tenant for tenant, index in self._indexes.items() if index.docs)

    def texts(self, tenant: str | None = None) -> list[tuple[str, list[int]]]:
        """(tenant, tokens) of every document (of ``tenant`` only, if given), least recently used first."""
        with self._lock:
            return [(t, list(self._indexes[t].docs[d])) for d, t in self._used.items() if tenant in (None, t)]

    def match(self, tenant: str, context: Sequence[int], limit: int) -> Match | None:
        with self._lock:
            index = self._indexes.get(tenant)
            return None if index is None else index.match(context, limit)

    def touch(self, document: int) -> None:
        with self._lock:
            if document in self._used:
                self._used.move_to_end(document)

    def record(self, tenant: str, tokens: Sequence[int]) -> None:
        """Keep ``tokens`` (a finished request's text) for ``tenant``, evicting the least recently used past
        the budget. Token ids must be in [0, vocab_size)."""
        if not isinstance(tenant, str):
            raise ValueError(f"tenant={tenant!r} is invalid: must be a string")
        tokens = [int(t) for t in tokens][-self.budget:]
        bad = next((t for t in tokens if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary: ids must be in [0, {self.vocab_size - 1}]")
        if not tokens:
            return
        with self._lock:
            index = self._indexes.setdefault(tenant, SuffixIndex(self.settings))
            for length in range(1, min(len(tokens), PREFIX_KEY) + 1):  # stored texts that start as this one
                for document in list(self._starts.get((tenant, tuple(tokens[:length])), ())):
                    stored = index.docs[document]
                    if stored == tokens[:len(stored)]:  # the same text, or one this continues: replace it
                        self._forget(document)
            start = (tenant, tuple(tokens[:PREFIX_KEY]))
            document, self._next = self._next, self._next + 1
            index.add(document, tokens)
            self._used[document] = tenant
            self._starts.setdefault(start, []).append(document)
            self.tokens += len(tokens)
            while self.tokens > self.budget:
                self._forget(next(iter(self._used)))

    def _forget(self, document: int) -> None:
        tenant = self._used.pop(document)
        tokens = self._indexes[tenant].remove(document)
        self.tokens -= len(tokens)
        start = (tenant, tuple(tokens[:PREFIX_KEY]))
        others = [d for d in self._starts.get(start, ()) if d != document]
        if others:
            self._starts[start] = others
        else:
            self._starts.pop(start, None)

    # --- the file -------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the table to ``path`` atomically (see the module for the format)."""
        texts = self.texts()
        payload = np.fromiter((t for _, doc in texts for t in doc), dtype="<u4", count=sum(len(d) for _, d in texts))
        header = {"format": FORMAT, "vocab_size": self.vocab_size, "tokens": int(payload.size),
                  "documents": [[tenant, len(doc)] for tenant, doc in texts],
                  "sha256": hashlib.sha256(payload.tobytes()).hexdigest()}

        def write(f) -> None:
            f.write(MAGIC)
            f.write(json.dumps(header, separators=(",", ":")).encode("utf-8") + b"\n")
            f.write(payload.tobytes())

        write_atomic(path, write, prefix=".specdec-history-")

    @classmethod
    def load(cls, path: str | os.PathLike, *, vocab_size: int | None = None, budget: int = DEFAULT_BUDGET,
             settings: HistorySettings = DEFAULT_SETTINGS) -> HistoryTable:
        """The table saved in ``path``, its documents recorded oldest first into a table of ``budget`` tokens;
        ``vocab_size``: the model's, which the file's must equal (None: the file's). A missing, bad or corrupt
        file is a :class:`HistoryFileError` naming it."""
        name = os.fspath(path)
        try:
            with open(name, "rb") as f:
                header, texts = _read(f, os.fstat(f.fileno()).st_size, budget)
        except OSError as err:
            raise HistoryFileError(f"history file {name!r} cannot be read: {err.strerror or err}") from None
        except HistoryFileError as err:
            raise HistoryFileError(f"history file {name!r} is not a valid specdec history table: {err}") from None
        if vocab_size is not None and header["vocab_size"] != vocab_size:
            raise HistoryFileError(f"history file {name!r} was written for a vocabulary of {header['vocab_size']} "
                                   f"tokens, and this model has {vocab_size}: it belongs to another tokenizer")
        table = cls(header["vocab_size"], budget, settings=settings)
        for tenant, tokens in texts:
            table.record(tenant, tokens)
        return table


def _read(f, size: int, budget: int) -> tuple[dict, list[tuple[str, np.ndarray]]]:
    """The header and the documents a table of ``budget`` tokens keeps (the last ones), every part checked."""
    if f.read(len(MAGIC)) != MAGIC:
        raise HistoryFileError("it does not start with the line 'specdec-history'")
    line = f.readline(MAX_HEADER_BYTES + 1)
    if not line.endswith(b"\n"):
        raise HistoryFileError("its header line is cut off or longer than 64 MiB")
    try:
        header = json.loads(line)
    except ValueError as err:
        raise HistoryFileError(f"its header is not JSON ({err})") from None
    docs = header.get("documents") if isinstance(header, dict) else None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise HistoryFileError(f"its header names no format {FORMAT}")
    vocab, tokens = header.get("vocab_size"), header.get("tokens")
    if not (_count(vocab) and vocab >= 1 and _count(tokens) and isinstance(docs, list)
            and isinstance(header.get("sha256"), str)):
        raise HistoryFileError("its header lacks vocab_size, tokens, documents or sha256")
    if not all(isinstance(d, list) and len(d) == 2 and isinstance(d[0], str) and _count(d[1]) for d in docs):
        raise HistoryFileError("a document entry is not [tenant, length]")
    if sum(d[1] for d in docs) != tokens:
        raise HistoryFileError(f"its documents' lengths do not add up to its {tokens} tokens")
    body = size - len(MAGIC) - len(line)
    if body != 4 * tokens:
        raise HistoryFileError(f"it holds {body} bytes of tokens where its header says {4 * tokens} "
                               "(truncated or appended to)")
    first, kept = len(docs), 0  # keep the last documents that fit in the budget (at least the last one)
    while first > 0 and (kept + docs[first - 1][1] <= budget or kept == 0):
        first -= 1
        kept += docs[first][1]
    keep_from = tokens - kept
    digest, parts, read = hashlib.sha256(), [], 0
    while read < tokens:
        chunk = f.read(4 * min(CHUNK, tokens - read))
        if len(chunk) % 4 or not chunk:
            raise HistoryFileError("its tokens end early")
        digest.update(chunk)
        values = np.frombuffer(chunk, dtype="<u4")
        lo = max(keep_from - read, 0)
        if lo < values.size:
            parts.append(values[lo:])
        read += values.size
    if digest.hexdigest() != header["sha256"]:
        raise HistoryFileError("its tokens do not match its SHA-256 (the file is corrupt)")
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype="<u4")
    if flat.size and int(flat.max()) >= vocab:
        raise HistoryFileError(f"it holds token id {int(flat.max())}, outside its vocabulary of {vocab}")
    out, at = [], 0
    for tenant, length in docs[first:]:
        out.append((tenant, flat[at:at + length]))
        at += length
    return header, out


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
