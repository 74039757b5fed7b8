"""Drafts from history: copy what followed the longest earlier match of the text's end, in the current
request and in a table of earlier texts (suffix decoding, as Snowflake's ArcticInference does it).

An agent re-sends and re-writes the same files, tool calls and phrases, request after request; prompt
lookup (``lookup``) sees only the current request. This drafter looks in two places: the current
request's own text (prompt and output so far), and a :class:`~specdec.drafters.history_table.HistoryTable`
of earlier requests' texts (bounded, least recently used evicted, one part per tenant). Each place is a
:class:`SuffixIndex`.

The rule, for one round with γ to draft:

1. **Candidates.** Every earlier occurrence of the text's last ``min_match`` tokens (K, default 3), the
   ``max_candidates`` most recent of them per K-gram; for each, its *match length*: how many tokens before
   it agree with the text's end, counted up to ``max_match``. No occurrence: nothing from this place.
2. **Levels.** For each of the (at most ``LEVELS``) longest distinct match lengths m, the candidates
   matching at least m tokens take part, and the draft may be ``min(γ, ⌊spec_factor · m + spec_offset⌋)``
   tokens long: a longer match earns a longer draft.
3. **The walk.** At each draft position the taking-part candidates vote with the token that followed them;
   the most frequent wins (a tie: the most recent candidate's); the draft's *confidence* is multiplied by
   the winner's share of the votes, and the walk stops before a token whose confidence would fall below
   ``min_prob``; the candidates that voted otherwise drop out. In the current request a copy may read what
   it has just copied (a repeating pattern continues itself), as prompt lookup's does.
4. **The best draft** of all levels and both places is the one of the highest *score* (the sum of its
   tokens' confidences, ArcticInference's); a tie goes to the longer match, then to the current request.

The draft is a deterministic function of what came before the round, so its q is one-hot on each guessed
token and the acceptance rule stays exact at any temperature (a guess x is kept with probability p(x);
greedy keeps it iff it is the target's argmax). Where the table's contents come from (other requests,
a file) does not matter to exactness, only to how often a guess is kept.

Cost: one dictionary look-up, ≤ ``max_candidates`` backward comparisons of ≤ ``max_match`` tokens, and a
walk of ≤ γ steps over the candidates: microseconds (``benchmarks/agent_traffic.py`` measures it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..checks import check_int
from ..sampling import SamplingParams
from .base import Allowed, Proposal, one_hot_rows

LEVELS = 4  # distinct match lengths tried per place (the longest ones)
TOKEN_BITS = 32  # a K-gram's key packs its tokens 32 bits each (exact: no two K-grams share a key)
POSITION_MASK = (1 << 32) - 1  # a position packs (document id << 32) | index


@dataclass(frozen=True)
class HistorySettings:
    """How the history drafter matches and how far it drafts (see the module's rule)."""

    min_match: int = 3  # K: the text's last K tokens must have occurred before
    max_match: int = 32  # match lengths are counted up to this
    max_candidates: int = 32  # occurrences kept per K-gram: the most recent
    min_prob: float = 0.1  # the walk stops before a token of lower confidence
    spec_factor: float = 1.0  # a draft is at most spec_factor · match length + spec_offset tokens
    spec_offset: float = 0.0

    def __post_init__(self) -> None:
        check_int("min_match", self.min_match, 1, 64, note=" (tokens that must match before a draft)")
        check_int("max_match", self.max_match, self.min_match, 4096, note=" (at least min_match)")
        check_int("max_candidates", self.max_candidates, 1, 4096, note=" (occurrences kept per K-gram)")
        if not isinstance(self.min_prob, int | float) or not 0.0 <= self.min_prob <= 1.0:
            raise ValueError(f"min_prob={self.min_prob!r} is invalid: must be a number in [0, 1]")
        for name in ("spec_factor", "spec_offset"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0.0 <= value <= 64.0:
                raise ValueError(f"{name}={value!r} is invalid: must be a number in [0, 64]")


DEFAULT_SETTINGS = HistorySettings()


@dataclass(frozen=True)
class Match:
    """One place's draft: the tokens, each one's confidence, the match length it came from, and the
    document of its most recent surviving candidate (what the table marks as used)."""

    tokens: list[int]
    probs: list[float]
    match_length: int
    document: int

    @property
    def score(self) -> float:
        return sum(self.probs)


def pack(tokens: Sequence[int]) -> int:
    key = 0
    for token in tokens:
        key = (key << TOKEN_BITS) | int(token)
    return key


class SuffixIndex:
    """Documents (token lists, by id) and, for each K-gram, the positions right after its most recent
    occurrences (at most ``max_candidates``). A K-gram at a document's very end has no continuation and is
    indexed once its next token arrives (:meth:`extend`)."""

    def __init__(self, settings: HistorySettings = DEFAULT_SETTINGS) -> None:
        self.settings = settings
        self.docs: dict[int, list[int]] = {}
        self._index: dict[int, list[int]] = {}  # K-gram key → positions (doc << 32 | index), oldest first

    @property
    def tokens(self) -> int:
        return sum(len(doc) for doc in self.docs.values())

    def add(self, doc_id: int, tokens: Sequence[int]) -> None:
        if doc_id in self.docs:
            raise ValueError(f"document {doc_id} is already in the index")
        self.docs[doc_id] = []
        self.extend(doc_id, tokens)

    def extend(self, doc_id: int, new: Sequence[int]) -> None:
        """Append ``new`` to a document; each new token is the continuation of the K-gram just before it."""
        doc, index = self.docs[doc_id], self._index
        k, cap = self.settings.min_match, self.settings.max_candidates
        mask = (1 << (TOKEN_BITS * k)) - 1
        key = pack(doc[-k:])
        base = doc_id << 32
        for token in new:
            token = int(token)
            position = len(doc)
            if position >= k:
                slots = index.get(key)
                if slots is None:
                    index[key] = [base | position]
                else:
                    slots.append(base | position)
                    if len(slots) > cap:
                        del slots[0]
            doc.append(token)
            key = ((key << TOKEN_BITS) | token) & mask  # the last K tokens' key, rolled on

    def remove(self, doc_id: int) -> list[int]:
        """Forget a document (and its positions); returns its tokens."""
        doc = self.docs.pop(doc_id)
        k = self.settings.min_match
        for position in range(k, len(doc)):
            key = pack(doc[position - k:position])
            slots = self._index.get(key)
            if slots is not None:
                kept = [p for p in slots if p >> 32 != doc_id]
                if kept:
                    self._index[key] = kept
                else:
                    del self._index[key]
        return doc

    def match(self, context: Sequence[int], limit: int, own: int | None = None) -> Match | None:
        """The best draft of at most ``limit`` tokens after ``context`` from this index (the module's rule),
        or None. ``own``: the id of the document that *is* ``context`` (the current request), whose copies
        may run on into the draft."""
        s = self.settings
        candidates = self.candidates(context) if limit >= 1 else []
        best: Match | None = None
        for level in sorted({c[0] for c in candidates}, reverse=True)[:LEVELS]:
            cap = min(limit, int(level * s.spec_factor + s.spec_offset + 1e-9))
            if cap < 1:
                continue
            found = self._walk([c for c in candidates if c[0] >= level], cap, own, level)
            if found is not None and (best is None or found.score > best.score):
                best = found
        return best

    def candidates(self, context: Sequence[int]) -> list[tuple[int, int, list[int], int]]:
        """Every indexed occurrence of ``context``'s last K tokens, most recent first, as (match length, document
        id, document, index of the token that followed): the match length counts the tokens before it that agree
        with ``context``'s end, up to ``max_match``."""
        k, n, most = self.settings.min_match, len(context), self.settings.max_match
        positions = self._index.get(pack(context[n - k:])) if n >= k else None
        out = []
        for packed in reversed(positions or ()):
            doc_id, end = packed >> 32, packed & POSITION_MASK
            doc = self.docs[doc_id]
            m, longest = k, min(most, n, end)
            while m < longest and doc[end - 1 - m] == context[n - 1 - m]:
                m += 1
            out.append((m, doc_id, doc, end))
        return out

    def _walk(self, live: list, cap: int, own: int | None, level: int) -> Match | None:
        tokens: list[int] = []
        probs: list[float] = []
        confidence, min_prob = 1.0, self.settings.min_prob
        for i in range(cap):
            votes: dict[int, int] = {}
            nexts = []
            for _, doc_id, doc, end in live:
                j = end + i
                token = doc[j] if j < len(doc) else tokens[j - len(doc)] if doc_id == own else None
                nexts.append(token)
                if token is not None:
                    votes[token] = votes.get(token, 0) + 1
            if not votes:
                break
            winner = max(votes, key=votes.__getitem__)  # the first of the most votes: the most recent's
            share = confidence * votes[winner] / len(live)
            if share < min_prob:
                break
            confidence = share
            tokens.append(winner)
            probs.append(confidence)
            live = [c for c, token in zip(live, nexts, strict=True) if token == winner]
        return Match(tokens, probs, level, live[0][1]) if tokens else None


def better(a: Match | None, b: Match | None) -> Match | None:
    """The better of two drafts: the higher score, then the longer match; a tie keeps ``a``."""
    if b is None:
        return a
    if a is None:
        return b
    return b if (b.score, b.match_length) > (a.score, a.match_length) else a


class HistoryDrafter:
    """Drafts from the current request's text and a table of earlier texts; q one-hot, no model call.

    ``history``: a tenant's view of a :class:`~specdec.drafters.history_table.HistoryTable`
    (``table.view(tenant)``), or None for the current request alone. ``sources`` counts whose draft each
    proposal was: ``{"request": n, "history": n}``.
    """

    reads_prompt = False

    def __init__(self, vocab_size: int, history=None, *, settings: HistorySettings = DEFAULT_SETTINGS,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> None:
        check_int("vocab_size", vocab_size)
        self.vocab_size, self.history, self.settings = vocab_size, history, settings
        self.device, self.dtype = torch.device(device), dtype
        where = "this request" if history is None else "this request and earlier ones"
        self.name = f"history (suffix matches of >= {settings.min_match} tokens in {where})"
        self.sources = {"request": 0, "history": 0}
        self.begin([])

    def begin(self, prompt: Sequence[int]) -> None:
        self._local = SuffixIndex(self.settings)
        self._local.add(0, prompt)
        self._tokens = self._local.docs[0]

    def propose(self, sequence: Sequence[int], gamma: int, sampling: SamplingParams,
                generator: torch.Generator, allowed: Allowed | None = None) -> Proposal:
        """Up to γ tokens by the module's rule, q one-hot on each; no model call.

        Example: the table holds [7, 1, 2, 3, 4, 5] (an earlier answer); this request's text is [9, 1, 2, 3].
        Its last 3 tokens (1, 2, 3) occurred in the table, followed by 4, 5; the match is 3 tokens long, so
        with γ = 4 the draft is [4, 5] (the document ends there)::

            >>> from specdec.drafters.history_table import HistoryTable
            >>> table = HistoryTable(vocab_size=10)
            >>> table.record("", [7, 1, 2, 3, 4, 5])
            >>> drafter = HistoryDrafter(10, table.view())
            >>> draft = drafter.propose([9, 1, 2, 3], 4, SamplingParams(), torch.Generator())
            >>> draft.tokens, draft.probs.argmax(dim=1).tolist(), draft.calls, drafter.sources
            ([4, 5], [4, 5], 0, {'request': 0, 'history': 1})
        """
        self._catch_up(sequence)
        tokens = self.lookup(gamma)
        if allowed is not None:  # under a constraint: the guesses up to the first it does not allow
            kept = 0
            while kept < len(tokens) and bool(allowed(tokens[:kept])[tokens[kept]]):
                kept += 1
            tokens = tokens[:kept]
        return Proposal(tokens, one_hot_rows(tokens, self.vocab_size, self.device, self.dtype), calls=0)

    def lookup(self, gamma: int) -> list[int]:
        """The best draft of up to γ tokens from this request and the table (the module's rule)."""
        own = self._local.match(self._tokens, gamma, own=0)
        other = self.history.match(self._tokens, gamma) if self.history is not None else None
        chosen = better(own, other)
        if chosen is None:
            return []
        if chosen is own:
            self.sources["request"] += 1
        else:
            self.sources["history"] += 1
            self.history.touch(chosen.document)
        return list(chosen.tokens)

    def commit(self, length: int) -> None:
        # Only verified tokens are indexed (drafts never are); a shorter sequence is a new text.
        if length < len(self._tokens):
            self.begin(self._tokens[:length])

    def _catch_up(self, sequence: Sequence[int]) -> None:
        known, tail = len(self._tokens), self.settings.min_match
        if len(sequence) < known or list(sequence[max(0, known - tail):known]) != self._tokens[-tail:]:
            self.begin(sequence)  # a different text than the one indexed: start over
        elif len(sequence) > known:
            self._local.extend(0, sequence[known:])
