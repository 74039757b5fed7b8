"""Which tokens a cut draft head keeps (``specdec.models.head``): the most frequent in a corpus.

Frequencies come from Python's own standard library (code, docstrings and comments), tokenized once
with the pair's tokenizer (seconds) and cached beside the models.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import sysconfig
from collections.abc import Sequence

import numpy as np

from ..cache import cache_dir, write_atomic


def frequent_tokens(tokenizer, n: int, counts: np.ndarray | None = None) -> list[int]:
    """The ``n`` most frequent token ids (ties to the lower id), plus every special/added token."""
    counts = token_counts(tokenizer) if counts is None else counts
    if not 1 <= n <= len(counts):
        raise ValueError(f"draft head size {n} is invalid: must be in [1, {len(counts)}] (the vocabulary)")
    order = np.lexsort((np.arange(len(counts)), -counts))  # by count, descending; then by id
    keep = set(order[:n].tolist())
    keep.update(int(i) for i in getattr(tokenizer, "added_tokens_decoder", {}) if int(i) < len(counts))
    keep.update(int(i) for i in getattr(tokenizer, "all_special_ids", []) if 0 <= int(i) < len(counts))
    return sorted(keep)


def tokenizer_key(tokenizer) -> str:
    """What the counts depend on, hashed: the whole tokenizer (vocabulary, merges, normalizer, pre-tokenizer) as its
    backend serializes it (0.16 s for Qwen2.5's; sorting and dumping its vocabulary took 0.8 s of every load that
    cuts the draft's head, AMD EPYC Zen 3); a tokenizer without a backend: its vocabulary."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def token_counts(tokenizer, vocab_size: int | None = None, cache: pathlib.Path | None = None,
                 files: Sequence[pathlib.Path] | None = None) -> np.ndarray:
    """How often each token id occurs in the top-level modules of Python's standard library, cached
    per tokenizer (``files``: another corpus)."""
    vocab_size = vocab_size or len(tokenizer)
    if cache is None:
        cache = cache_dir() / "token-counts"
    path = cache / f"stdlib-top-{tokenizer_key(tokenizer)}-{vocab_size}.npy"
    if path.is_file():
        return np.load(path)
    if files is None:
        files = sorted(pathlib.Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))  # ~1.5M tokens
    counts = np.zeros(vocab_size, dtype=np.int64)
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        counts += np.bincount(ids[ids < vocab_size], minlength=vocab_size)
    cache.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda f: np.save(f, counts))
    return counts
