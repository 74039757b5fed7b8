"""NgramModel: a sparse n-gram table with backoff, behind the LanguageModel protocol.

The paper's cheapest kind of draft (spec §3.6: a bigram model reached α ≈ 0.2 on EnDe, a
speed-up at c ≈ 0). ``ModelDrafter(NgramModel)`` drafts from it like from any model, and since
``score`` returns the log of the very distribution the drafter samples from (after the same
sampling transform), q is exact and the rule keeps the target's distribution.

The table, for order N: for every context of k - 1 tokens seen in the corpus (k = 1..N), the
``top_k`` most likely next tokens and their probabilities. Probabilities are interpolated absolute
discounting (Kneser–Ney's smoothing with plain counts)::

    P(w | ctx) = max(c(ctx, w) − D, 0) / c(ctx) + D · n(ctx) / c(ctx) · P(w | ctx[1:])

(c: counts, n(ctx): distinct tokens seen after ctx, D: the discount), restricted to the union of
the tokens seen after ctx and the lower order's kept tokens, cut to the ``top_k`` largest and
renormalized. Every other token has probability 0 (a ``-inf`` logit). Scoring looks up the
longest context of the sequence's last N − 1 tokens that is in the table (backing off to
shorter ones) and writes its ``top_k`` entries into one ``[vocab]`` row.

Files (``save`` / ``load``) are compressed ``.npz`` archives written atomically.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..checks import check_int
from .base import NO_ABILITIES, check_trim

FORMAT = "specdec-ngram"
VERSION = 1
DEFAULT_TOP_K = 32
DEFAULT_DISCOUNT = 0.75


@dataclass(frozen=True)
class NgramTable:
    """One order k: contexts of k − 1 tokens and their kept continuations."""

    contexts: np.ndarray  # [M, k - 1] int64, sorted lexicographically
    tokens: np.ndarray  # [M, top_k] int64, -1 where a context keeps fewer than top_k
    probs: np.ndarray  # [M, top_k] float64, 0 where tokens is -1; rows sum to 1


class NgramModel:
    """A fitted n-gram table used as a language model (it keeps its own token cache)."""

    abilities = NO_ABILITIES

    def __init__(self, tables: Sequence[NgramTable], vocab_size: int, *, meta: dict | None = None,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> None:
        if not tables:
            raise ValueError("an n-gram model needs at least the order-1 table")
        self.order = len(tables)
        self.vocab_size = int(vocab_size)
        self.max_length: int | None = None
        self.device, self.dtype = torch.device(device), dtype
        self.meta = dict(meta or {})
        self.tables = tuple(tables)
        self.name = f"order-{self.order} n-gram"
        self._rows = [_row_index(t.contexts) for t in self.tables]  # context tuple → row, per order
        self._np_dtype = np.float64 if dtype == torch.float64 else np.float32  # rows are built in numpy
        self._entries = [_dense(t, self._np_dtype) for t in self.tables]  # per order: (tokens, log-probs)
        self._tokens: list[int] = []

    # ------------------------------------------------------------------ fitting

    @classmethod
    def fit(cls, sequences: Iterable[Sequence[int]], order: int, vocab_size: int, *, top_k: int = DEFAULT_TOP_K,
            discount: float = DEFAULT_DISCOUNT, min_count: int = 1, meta: dict | None = None,
            **kwargs) -> NgramModel:
        """Count n-grams of each order 1..``order`` (never across two sequences) and smooth them.

        ``min_count``: contexts of order ≥ 2 seen fewer times are left out of the table (the
        lower order serves them), which keeps a file small; 1 keeps everything.
        """
        check_fit_args(order, vocab_size, top_k, discount, min_count)
        stream = _concatenate(sequences, vocab_size)  # [total] with -1 between sequences
        if not (stream >= 0).any():
            raise ValueError("the corpus is empty: give at least one token")
        tables: list[NgramTable] = []
        full: NgramTable | None = None
        for k in range(1, order + 1):
            full, totals = _fit_order(stream, k, vocab_size, top_k, discount, full)
            tables.append(full if k == 1 else _prune(full, totals, min_count))
        info = {"order": order, "top_k": top_k, "discount": discount, "min_count": min_count,
                "tokens": int((stream >= 0).sum())} | dict(meta or {})
        return cls(tables, vocab_size, meta=info, **kwargs)

    # ------------------------------------------------------------------ the LanguageModel protocol

    @property
    def length(self) -> int:
        return len(self._tokens)

    def prefill(self, tokens: Sequence[int]) -> int:
        self._tokens = [int(t) for t in tokens]
        return 0

    def score(self, tokens: Sequence[int]) -> torch.Tensor:
        """[k, vocab] logits (log-probabilities, -inf off the kept tokens) after each appended token.

        Built in numpy (single-threaded: a few microseconds, no OpenMP hand-off) and handed over
        without a copy on the CPU.
        """
        rows = np.full((len(tokens), self.vocab_size), -np.inf, dtype=self._np_dtype)  # [k, vocab]
        for i, token in enumerate(tokens):
            self._tokens.append(int(token))
            order, row = self.context_row(self._tokens)
            ids, logp = self._entries[order]
            rows[i, ids[row]] = logp[row]
        return torch.from_numpy(rows).to(device=self.device, dtype=self.dtype)

    def trim(self, length: int) -> None:
        check_trim(self, length)
        del self._tokens[length:]

    def context_row(self, sequence: Sequence[int]) -> tuple[int, int]:
        """(order index, row) of the longest suffix of ``sequence`` that is a context in the table."""
        for k in range(min(self.order, len(sequence) + 1), 1, -1):
            row = self._rows[k - 1].get(tuple(sequence[len(sequence) - (k - 1) :]))
            if row is not None:
                return k - 1, row
        return 0, 0

    # ------------------------------------------------------------------ files

    def save(self, path: str | os.PathLike) -> None:
        """Write a compressed .npz archive atomically (a temporary file renamed onto ``path``)."""
        path = os.fspath(path)
        arrays = {"meta": np.array(json.dumps({"format": FORMAT, "version": VERSION, "vocab_size": self.vocab_size,
                                               "order": self.order} | {"info": self.meta}))}
        for k, table in enumerate(self.tables, start=1):
            arrays[f"contexts_{k}"] = table.contexts.astype(np.int32)
            arrays[f"tokens_{k}"] = table.tokens.astype(np.int32)
            arrays[f"probs_{k}"] = table.probs.astype(np.float32)
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez_compressed(f, **arrays)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike, *, vocab_size: int | None = None, **kwargs) -> NgramModel:
        """Read a file written by ``save``. ``vocab_size`` may widen the table's vocabulary to a
        target's (ids the table never saw get probability 0), never narrow it."""
        path = os.fspath(path)
        meta = read_header(path)
        stored = int(meta["vocab_size"])
        if vocab_size is not None and vocab_size < stored:
            raise ValueError(f"n-gram file {path!r} covers {stored} token ids, more than the target's vocabulary of "
                             f"{vocab_size}: it was fitted with a different tokenizer")
        try:
            with np.load(path, allow_pickle=False) as data:
                tables = [NgramTable(data[f"contexts_{k}"].astype(np.int64), data[f"tokens_{k}"].astype(np.int64),
                                     data[f"probs_{k}"].astype(np.float64)) for k in range(1, int(meta["order"]) + 1)]
        except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError) as err:
            raise ValueError(f"n-gram file {path!r} is damaged: {err}") from None
        for k, table in enumerate(tables, start=1):
            _check_table(path, table, k, stored)
        return cls(tables, vocab_size or stored, meta=meta.get("info", {}), **kwargs)


def read_header(path: str) -> dict:
    """The file's metadata, checked; a missing, foreign or damaged file is a ValueError naming it."""
    if not os.path.isfile(path):
        raise ValueError(f"n-gram file {path!r} does not exist")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path!r} is not a specdec n-gram file (not an .npz archive; write one with "
                         "`specdec fit-draft`)")
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise ValueError(f"{path!r} is not a specdec n-gram file (write one with `specdec fit-draft`): {err}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{path!r} is not a specdec n-gram file (write one with `specdec fit-draft`)")
    if meta.get("version") != VERSION:
        raise ValueError(f"n-gram file {path!r} has format version {meta.get('version')!r}; "
                         f"this specdec reads {VERSION}")
    if not isinstance(meta.get("order"), int) or meta["order"] < 1 or not isinstance(meta.get("vocab_size"), int):
        raise ValueError(f"n-gram file {path!r} is damaged: bad order or vocab_size in its header")
    return meta


def check_fit_args(order, vocab_size, top_k, discount, min_count) -> None:
    for name, value in (("order", order), ("vocab_size", vocab_size), ("top_k", top_k), ("min_count", min_count)):
        check_int(name, value)
    if not 0.0 < discount < 1.0:
        raise ValueError(f"discount={discount!r} is invalid: must be in (0, 1)")
    bits = max(1, (vocab_size - 1).bit_length())
    if order * bits > 62:
        raise ValueError(f"order={order} is too high for a vocabulary of {vocab_size} tokens: order × {bits} bits must "
                         f"fit in 62, so order must be <= {62 // bits}")


# ---------------------------------------------------------------------- fitting, vectorized


def _concatenate(sequences: Iterable[Sequence[int]], vocab_size: int) -> np.ndarray:
    parts = []
    for seq in sequences:
        ids = np.asarray(list(seq) if not isinstance(seq, np.ndarray) else seq, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"token ids must be in [0, {vocab_size - 1}], found {int(ids.min())}..{int(ids.max())}")
        parts += [ids, np.array([-1], dtype=np.int64)]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


def _keys(grams: np.ndarray, bits: int) -> np.ndarray:
    """Each row of token ids [M, m] as one int64 (m × bits ≤ 62)."""
    keys = np.zeros(grams.shape[0], dtype=np.int64)
    for col in range(grams.shape[1]):
        keys = (keys << bits) | grams[:, col]
    return keys


def _count(stream: np.ndarray, k: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct k-grams (as sorted keys) and their counts; windows across a -1 separator are dropped."""
    if stream.size < k:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(stream, k)  # [T - k + 1, k]
    windows = windows[(windows >= 0).all(axis=1)]
    return np.unique(_keys(windows, bits), return_counts=True)


def _fit_order(stream, k, vocab_size, top_k, discount, lower: NgramTable | None) -> tuple[NgramTable, np.ndarray]:
    """The order-k table, smoothed against the (unpruned) order k − 1, and c(ctx) per context."""
    bits = max(1, (vocab_size - 1).bit_length())
    keys, counts = _count(stream, k, bits)
    mask = (1 << bits) - 1
    next_token = keys & mask
    context_keys, group = np.unique(keys >> bits, return_inverse=True)  # the contexts of k - 1 tokens
    totals = np.bincount(group, weights=counts).astype(np.float64)  # c(ctx)
    if lower is None:  # order 1: relative frequencies
        entry_group, entry_token, entry_mass = group, next_token, counts / totals[group]
    else:
        distinct = np.bincount(group).astype(np.float64)  # n(ctx)
        backoff = discount * distinct / totals  # the mass handed to the lower order
        # The lower order's row for each context: its context minus the first token.
        lower_keys = _keys(lower.contexts, bits) if lower.contexts.shape[1] else np.zeros(1, dtype=np.int64)
        shorter = context_keys & ((1 << (bits * (k - 2))) - 1) if k > 2 else np.zeros_like(context_keys)
        lower_row = np.searchsorted(lower_keys, shorter)
        low_tokens = lower.tokens[lower_row]  # [M, top_k]
        low_mass = lower.probs[lower_row] * backoff[:, None]
        kept = low_tokens >= 0
        entry_group = np.concatenate([group, np.nonzero(kept)[0]])
        entry_token = np.concatenate([next_token, low_tokens[kept]])
        entry_mass = np.concatenate([np.maximum(counts - discount, 0.0) / totals[group], low_mass[kept]])
    return _top_k_table(context_keys, entry_group, entry_token, entry_mass, k, bits, top_k), totals


def _top_k_table(context_keys, entry_group, entry_token, entry_mass, k, bits, top_k) -> NgramTable:
    """Sum duplicate (context, token) entries, keep each context's top_k, renormalize."""
    n_tokens = 1 << bits
    merged, inverse = np.unique(entry_group * n_tokens + entry_token, return_inverse=True)
    mass = np.bincount(inverse, weights=entry_mass)
    group, token = merged // n_tokens, merged % n_tokens
    order = np.lexsort((token, -mass, group))  # by context, then most likely first, ties by id
    group, token, mass = group[order], token[order], mass[order]
    starts = np.searchsorted(group, np.arange(context_keys.size))
    rank = np.arange(group.size) - starts[group]
    keep = rank < top_k
    group, token, mass, rank = group[keep], token[keep], mass[keep], rank[keep]
    tokens = np.full((context_keys.size, top_k), -1, dtype=np.int64)
    probs = np.zeros((context_keys.size, top_k), dtype=np.float64)
    tokens[group, rank] = token
    probs[group, rank] = mass
    probs /= probs.sum(axis=1, keepdims=True)
    contexts = np.stack([(context_keys >> (bits * (k - 2 - i))) & ((1 << bits) - 1) for i in range(k - 1)], axis=1) \
        if k > 1 else np.zeros((1, 0), dtype=np.int64)
    return NgramTable(contexts.astype(np.int64), tokens, probs)


def _prune(table: NgramTable, totals: np.ndarray, min_count: int) -> NgramTable:
    """Drop contexts seen fewer than ``min_count`` times (the lower order serves them)."""
    keep = totals >= min_count
    return NgramTable(table.contexts[keep], table.tokens[keep], table.probs[keep])


# ---------------------------------------------------------------------- loading helpers


def _row_index(contexts: np.ndarray) -> dict:
    return {tuple(row): i for i, row in enumerate(contexts.tolist())}


def _dense(table: NgramTable, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Per-row token ids and log-probabilities to write a row with; padding repeats the row's first entry."""
    tokens = table.tokens.copy()
    probs = table.probs.copy()
    pad = tokens < 0
    tokens[pad] = np.broadcast_to(tokens[:, :1], tokens.shape)[pad]
    probs[pad] = np.broadcast_to(probs[:, :1], probs.shape)[pad]
    with np.errstate(divide="ignore"):
        return tokens, np.log(probs).astype(dtype)


def _check_table(path: str, table: NgramTable, k: int, vocab_size: int) -> None:
    m, width = table.tokens.shape if table.tokens.ndim == 2 else (-1, -1)
    ok = (
        table.contexts.ndim == 2 and table.contexts.shape == (m, k - 1) and table.probs.shape == (m, width)
        and (m == 1 if k == 1 else m >= 0) and width >= 1
        and bool(((table.tokens >= -1) & (table.tokens < vocab_size)).all())
        and bool(((table.contexts >= 0) & (table.contexts < vocab_size)).all())
        and bool((table.tokens[:, 0] >= 0).all())
        and bool(np.isfinite(table.probs).all()) and bool((table.probs >= 0).all())
        and bool(np.allclose(table.probs.sum(axis=1), 1.0, atol=1e-3))
    )
    if not ok:
        raise ValueError(f"n-gram file {path!r} is damaged: its order-{k} table is inconsistent")
