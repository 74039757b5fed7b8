"""The prefix cache: prompt-read KV rows kept after a request, so the next one that starts the same way
reads only the rest.

Terms:

- an *entry* is one model's KV rows for the tokens a ``prefill`` read (``tokens``, ``rows``: the
  backend's own copy, exactly ``len(tokens)`` positions), the model it belongs to, and when it was
  last used;
- a *hit* of ``n`` tokens: the longest prefix a new prompt shares with any entry of that model; the
  model copies the entry's first ``n`` rows into the request's own fresh cache and reads the rest;
- the *budget* (``--cache-gb``) bounds the bytes of all entries together, target's and draft's; the
  least recently used entry goes first. An entry whose tokens are a prefix of a newer one (the turn
  before in the same conversation) is dropped when the newer one is added: it has nothing more to give.

Exactness, and why only prompt-read rows. A model writes KV rows with two arithmetics: the prompt
product while reading a prompt, the scoring product while generating (``models/native.py``); they
differ in their last bits. Entries hold rows a ``prefill`` wrote, never a generated answer's, and a
prompt's rows read after a cached prefix are bit for bit those of reading it whole (each row is
computed by itself), so a request's output never depends on what happened to be cached before it
(``tests/test_prefix_cache.py`` checks exactly that). A request's own cache is a copy: no request can
change an entry, nor another request's cache.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

DEFAULT_CACHE_GB = 2.0


@dataclass(eq=False)
class Entry:
    owner: object  # the key of the model whose rows these are (``prefix_key``: unique per model object)
    tokens: np.ndarray  # [n] int64, the tokens the rows are of
    rows: object  # the backend's copy of the KV rows for positions 0..n-1
    nbytes: int
    used: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class PrefixStats:
    """Prompt tokens read by the models vs reused from the cache, and what the cache holds."""

    read: int
    reused: int
    entries: int
    nbytes: int


class PrefixCache:
    """Entries of several models under one byte budget; thread-safe (the server reads prompts on its
    engine thread, a CLI on its main thread)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes={max_bytes!r} is invalid: must be >= 0 (0 turns the cache off)")
        self.max_bytes = int(max_bytes)
        self._entries: list[Entry] = []
        self._lock = threading.Lock()
        self._read = self._reused = 0
        self._holding = 0  # > 0: ``add`` keeps nothing (``holding``)

    @classmethod
    def of_gb(cls, gb: float) -> PrefixCache:
        if not gb >= 0:
            raise ValueError(f"cache_gb={gb!r} is invalid: must be a number >= 0 (0 turns the prefix cache off)")
        return cls(int(gb * 2**30))

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

    def add(self, owner: object, tokens: Sequence[int], rows: object, nbytes: int) -> None:
        """Keep ``rows`` (the KV of ``tokens``, a copy nobody else writes) for ``owner``; evict the
        least recently used entries over the budget. Rows larger than the whole budget are not kept."""
        if not len(tokens) or nbytes > self.max_bytes or self._holding:
            return
        new = Entry(owner, np.asarray(tokens, dtype=np.int64), rows, int(nbytes))
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
            return PrefixStats(self._read, self._reused, len(self._entries), sum(e.nbytes for e in self._entries))

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
