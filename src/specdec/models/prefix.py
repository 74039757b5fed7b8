"""The prefix cache: prompt-read KV rows kept after a request, so the next one that starts the same way
reads only the rest.

Terms:

- an *entry* is one model's KV rows for the tokens a ``prefill`` read (``tokens``; ``rows``: the
  buffer they were read into, not a copy, holding them in its first ``len(tokens)`` positions and
  maybe a request's rows after them), the model it belongs to, and when it was last used;
- a *hit* of ``n`` tokens: the longest prefix a new prompt shares with any entry of that model; the
  request starts from the entry's first ``n`` rows and reads the rest;
- *lending*: an entry's rows live in the buffer of the request that read them (no copy is made to keep
  them), and that request goes on writing its answer's rows after them. A later request whose hit covers
  most of an entry (``LEND_FROM``: the same file with another question) *borrows* the buffer once the one
  before is gone: no copy, the entry shrinks to the rows it shares; while another request still writes
  there, or for a small hit of a long entry, it starts from a copy of the rows. Rows below an entry's
  length are never written: a model copies its buffer first if it would write there (``lend``);
- the *budget* (``--cache-gb``) bounds the bytes of all entries together, target's and draft's; the
  least recently used entry goes first. An entry whose tokens are a prefix of a newer one (the turn
  before in the same conversation) is dropped when the newer one is added: it has nothing more to give.

Exactness, and why only prompt-read rows. A model writes KV rows with two arithmetics: the prompt
product while reading a prompt, the scoring product while generating (``models/native.py``); they
differ in their last bits. Entries hold rows a ``prefill`` wrote, never a generated answer's, and a
prompt's rows read after a cached prefix are bit for bit those of reading it whole (each row is
computed by itself), so a request's output never depends on what happened to be cached before it
(``tests/test_prefix_cache.py`` checks exactly that). No request can change an entry's rows, nor write where
another request writes: a buffer has one writer at a time.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

DEFAULT_CACHE_GB = 2.0
LEND_FROM = 0.75  # a hit of at least this share of an entry borrows its buffer (the rest of the entry is let go)


def check_cache_gb(gb: object, name: str = "cache_gb") -> float:
    """``gb`` if it is a budget in GiB (a finite number >= 0; 0 turns the cache off), else the one ValueError
    naming it (``name``: how the caller spells the setting, e.g. ``--cache-gb``)."""
    number = isinstance(gb, (int, float)) and not isinstance(gb, bool)
    if not number or not math.isfinite(gb) or gb < 0:
        raise ValueError(f"{name}={gb!r} is invalid: must be a number >= 0 (0 turns the prefix cache off)")
    return gb


@dataclass(eq=False)
class Entry:
    owner: object  # the key of the model whose rows these are (``prefix_key``: unique per model object)
    tokens: np.ndarray  # [n] int64, the tokens the rows are of
    rows: object  # the backend's buffer holding the KV rows for positions 0..n-1 (and maybe a request's after)
    nbytes: int
    used: float = field(default_factory=time.monotonic)
    writer: weakref.ref | None = None  # the request cache writing after the rows in that buffer, while it lives


@dataclass(frozen=True)
class PrefixStats:
    """Prompt tokens read by the models vs reused from the cache, and what the cache holds."""

    read: int
    reused: int
    entries: int
    nbytes: int
    lent: int = 0  # hits that borrowed an entry's buffer (no copy)


class PrefixCache:
    """Entries of several models under one byte budget; thread-safe (the server reads prompts on its
    engine thread, a CLI on its main thread)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes={max_bytes!r} is invalid: must be >= 0 (0 turns the cache off)")
        self.max_bytes = int(max_bytes)
        self._entries: list[Entry] = []
        self._lock = threading.Lock()
        self._read = self._reused = self._lent = 0
        self._holding = 0  # > 0: ``add`` keeps nothing (``holding``)

    @classmethod
    def of_gb(cls, gb: float) -> PrefixCache:
        return cls(int(check_cache_gb(gb) * 2**30))

    def longest(self, owner: object, tokens: Sequence[int]) -> tuple[Entry | None, int]:
        """The entry of ``owner`` sharing the longest prefix with ``tokens``, and that prefix's length
        (``(None, 0)`` when none shares a token)."""
        wanted = np.asarray(tokens, dtype=np.int64)
        best, best_n = None, 0
        with self._lock:
            for entry in self._entries:
                if entry.owner != owner:
                    continue
                n = common_prefix(entry.tokens, wanted)
                if n > best_n:
                    best, best_n = entry, n
            if best is not None:
                best.used = time.monotonic()
        return best, best_n

    def add(self, owner: object, tokens: Sequence[int], rows: object, nbytes: int, writer: object = None) -> None:
        """Keep ``rows`` (a buffer holding the KV of ``tokens`` first) for ``owner``; ``writer``: the request
        cache that goes on writing after them in that buffer (None: nobody). Evicts the least recently used
        entries over the budget; rows larger than the whole budget are not kept."""
        if not len(tokens) or nbytes > self.max_bytes or self._holding:
            return
        new = Entry(owner, np.asarray(tokens, dtype=np.int64), rows, int(nbytes),
                    writer=None if writer is None else weakref.ref(writer))
        with self._lock:
            covering = next((e for e in self._entries if extends(e, new)), None)
            if covering is not None:  # an entry holds these rows already (and maybe more)
                covering.used = time.monotonic()
                return
            # An entry the new one extends (or equals) has nothing more to give.
            self._entries = [e for e in self._entries if not extends(new, e)]
            self._entries.append(new)
            total = sum(e.nbytes for e in self._entries)
            for entry in sorted(self._entries, key=lambda e: e.used):
                if total <= self.max_bytes:
                    break
                self._entries.remove(entry)
                total -= entry.nbytes

    def lend(self, entry: Entry, borrower: object, keep: int) -> bool:
        """Whether ``borrower`` (a request's cache) may write after the first ``keep`` rows of ``entry`` in its
        buffer: only when no other live cache writes there; if so, it becomes the entry's writer and the entry
        shrinks to those rows (the rest will be overwritten)."""
        with self._lock:
            current = entry.writer() if entry.writer is not None else None
            taken = current is not None and current is not borrower
            if taken or not 0 < keep <= len(entry.tokens):
                return False
            entry.writer = weakref.ref(borrower)
            entry.tokens = entry.tokens[:keep]
            self._lent += 1
            return True

    @contextlib.contextmanager
    def holding(self):
        """Within: prefills still reuse entries, but add none (so a comparison run meets the cache as
        the run before it did)."""
        with self._lock:
            self._holding += 1
        try:
            yield self
        finally:
            with self._lock:
                self._holding -= 1

    def count(self, read: int, reused: int) -> None:
        with self._lock:
            self._read += read
            self._reused += reused

    def stats(self) -> PrefixStats:
        with self._lock:
            return PrefixStats(self._read, self._reused, len(self._entries), sum(e.nbytes for e in self._entries),
                               self._lent)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def extends(new: Entry, old: Entry) -> bool:
    """Whether ``new`` holds every row ``old`` does (same model, ``old``'s tokens a prefix of ``new``'s)."""
    return (new.owner == old.owner and len(old.tokens) <= len(new.tokens)
            and common_prefix(old.tokens, new.tokens) == len(old.tokens))


def prefix_key(model: object) -> str:
    """A key unique to ``model`` for as long as the process lives (``id`` alone can be reused)."""
    return f"{type(model).__name__}-{id(model)}-{next(_keys)}"


_keys = itertools.count()


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` and ``b`` share.

    >>> common_prefix(np.array([1, 2, 3, 4]), np.array([1, 2, 9]))
    2
    """
    m = min(len(a), len(b))
    if m == 0:
        return 0
    differ = np.flatnonzero(a[:m] != b[:m])
    return int(differ[0]) if differ.size else m
