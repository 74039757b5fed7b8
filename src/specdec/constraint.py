"""Constraints on what may be generated (a grammar, a JSON schema, a tool call), as one more sampling adjustment.

Spec §2.2: every sampling method is "adjust the probability list, then draw from it". A constraint is one more
adjustment: at each position it *allows* a set of tokens (a mask), and the list drawn from is the sampling
transform of the logits with every other token at -inf. Applied identically to the target's p and the draft's q
at every drafted position, the rule and its proof are unchanged, so speculative output is exactly the
constrained target distribution — and every draft is valid.

Terms:

- a *constraint* (:class:`Constraint`) is one sequence's matcher state: ``allowed()`` the mask of the next
  token, ``consume(tokens)`` moves on, ``rollback(n)`` moves back (rejected drafts), ``forced()`` the tokens
  the grammar allows alone from here (they become drafts that cost no draft call);
- the *mask* is ``[vocab]`` bool; :func:`mask_logits` puts -inf outside it (the logits keep their dtype and
  device; rows with every token masked are refused);
- :class:`DraftMasks` is one round's masks: the mask after each prefix of the drafts (``after(drafts[:i])``),
  which the drafter draws under and the target's rows are masked by, then ``settle`` moves the constraint to
  the verified tokens;
- a *lazy* constraint (:class:`Lazy`, llama.cpp's lazy grammars) allows every token until a call is recognised
  (a *trigger* token, a tool call's marker; or a call that opens the reply, once its name is written), and from
  there on is the call's constraint: free text, then a call that matches its schema. Its mask is still a
  function of the tokens so far, so the rule's proof holds as for any other; free positions get
  :func:`everything`, which costs nothing.

Two implementations: :class:`TokenAutomaton` (a small automaton over token ids: the reference oracle of the
tests) and ``specdec.grammar.Grammar`` (llguidance: JSON schemas, Lark grammars, regular expressions over a
real tokenizer); :class:`Lazy` wraps either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Constraint(Protocol):
    vocab_size: int

    def allowed(self) -> torch.Tensor:  # → [vocab] bool, the tokens allowed next
        ...

    def consume(self, tokens: Sequence[int]) -> None:
        """Move on past ``tokens`` (each must be allowed where it stands; ValueError otherwise)."""
        ...

    def rollback(self, n: int) -> None:
        """Move back ``n`` tokens (at most as many as were consumed)."""
        ...

    def forced(self) -> list[int]:
        """Tokens the constraint allows alone from here, in order (possibly none)."""
        ...


@lru_cache(maxsize=8)
def everything(vocab_size: int) -> torch.Tensor:  # → [vocab] bool, all True (one shared tensor: never write it)
    """The mask that allows every token (a lazy constraint before its trigger); :func:`mask_logits` knows it."""
    return torch.ones(vocab_size, dtype=torch.bool)


class NoAllowedMass(ValueError):
    """The model gives probability 0 to every token the constraint allows (a draft whose head was cut to its
    most frequent tokens, at a position whose allowed tokens are all past the cut): a drafter stops drafting
    there, the target draws the position itself."""


def mask_logits(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``logits`` ([..., vocab]) with -inf where ``allowed`` ([..., vocab] bool) is False; a new tensor (``logits``
    itself when ``allowed`` is :func:`everything`)."""
    if allowed is everything(allowed.shape[-1]):
        return logits
    if not bool(allowed.any(dim=-1).all()):
        raise ValueError("the constraint allows no token here: a mask must allow at least one")
    masked = logits.masked_fill(~allowed.to(logits.device), float("-inf"))
    if not bool((masked > float("-inf")).any(dim=-1).all()):
        raise NoAllowedMass("the model gives probability 0 to every token the constraint allows here")
    return masked


class DraftMasks:
    """One round's masks over a constraint. ``after(drafts)`` is the mask after the constraint's state plus
    ``drafts`` (a drafter asks for each prefix of its drafts in turn, the round for every prefix of the
    proposal; each mask is computed once); ``settle(kept)`` leaves the constraint after ``kept`` tokens of
    the round (the accepted drafts and the target's own token)."""

    def __init__(self, constraint: Constraint) -> None:
        self.constraint = constraint
        self.drafts: list[int] = []  # the tokens consumed past the round's start
        self.masks: dict[int, torch.Tensor] = {}  # prefix length → mask

    def after(self, drafts: Sequence[int]) -> torch.Tensor:  # → [vocab] bool
        drafts = [int(t) for t in drafts]
        n = len(drafts)
        if n in self.masks and self.drafts[:n] == drafts:
            return self.masks[n]
        common = 0
        while common < min(n, len(self.drafts)) and self.drafts[common] == drafts[common]:
            common += 1
        if common < len(self.drafts):  # another continuation than the one consumed: back up
            self.constraint.rollback(len(self.drafts) - common)
            self.masks = {k: m for k, m in self.masks.items() if k <= common}
            del self.drafts[common:]
        for token in drafts[common:]:
            self.constraint.consume([token])
            self.drafts.append(token)
        mask = self.masks.get(n)
        if mask is None:
            mask = self.masks[n] = self.constraint.allowed()
        return mask

    def forced_after(self, drafts: Sequence[int], most: int) -> list[int]:
        """The tokens the constraint allows alone after ``drafts`` (at most ``most``): drafts that cost no call."""
        if most <= 0:
            return []
        self.after(drafts)
        return self.constraint.forced()[:most]

    def settle(self, kept: Sequence[int]) -> None:
        """The round kept ``kept``: its accepted drafts (a prefix of the consumed ones), then the target's token."""
        kept = [int(t) for t in kept]
        accepted = 0
        while accepted < min(len(kept), len(self.drafts)) and kept[accepted] == self.drafts[accepted]:
            accepted += 1
        self.constraint.rollback(len(self.drafts) - accepted)
        self.constraint.consume(kept[accepted:])
        self.drafts, self.masks = [], {}


class TokenAutomaton:
    """A deterministic automaton over token ids: ``edges[state][token] = next state``; the tokens allowed in
    a state are its edges. A constraint for tests and small vocabularies (the exact constrained distribution
    is computable by enumerating its paths); ``start`` its first state.

    Example: over 4 tokens, ``TokenAutomaton({0: {1: 1, 2: 2}, 1: {3: 0}, 2: {3: 0}}, 4)`` allows 1 or 2 first,
    then 3, then 1 or 2 again, …; ``forced()`` in state 1 is [3] (3 alone is allowed, and from state 0 both
    branches remain), in state 0 it is [].
    """

    def __init__(self, edges: Mapping[int, Mapping[int, int]], vocab_size: int, start: int = 0) -> None:
        self.edges = {int(s): {int(t): int(n) for t, n in out.items()} for s, out in edges.items()}
        self.vocab_size = vocab_size
        for state, out in self.edges.items():
            if not out:
                raise ValueError(f"state {state} allows no token: every state needs an edge")
            bad = [t for t in out if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"state {state} has tokens {bad} outside the vocabulary [0, {vocab_size})")
            missing = [n for n in out.values() if n not in self.edges]
            if missing:
                raise ValueError(f"state {state} leads to states {missing} that have no edges")
        if start not in self.edges:
            raise ValueError(f"start state {start} has no edges")
        self.path = [start]  # the states visited, the current one last

    @property
    def state(self) -> int:
        return self.path[-1]

    def allowed(self) -> torch.Tensor:
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[list(self.edges[self.state])] = True
        return mask

    def consume(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            nxt = self.edges[self.state].get(int(token))
            if nxt is None:
                raise ValueError(f"token {token} is not allowed in state {self.state} "
                                 f"(allowed: {sorted(self.edges[self.state])})")
            self.path.append(nxt)

    def rollback(self, n: int) -> None:
        if not 0 <= n < len(self.path):
            raise ValueError(f"cannot roll back {n} tokens: {len(self.path) - 1} were consumed")
        if n:
            del self.path[-n:]

    def forced(self) -> list[int]:
        out, state = [], self.state
        while len(self.edges[state]) == 1 and len(out) < 64:
            (token, state), = self.edges[state].items()
            out.append(token)
        return out

    def copy(self) -> TokenAutomaton:
        other = TokenAutomaton(self.edges, self.vocab_size, self.path[0])
        other.path = list(self.path)
        return other


class Lazy:
    """Free text, with a call constrained from where it is recognised (llama.cpp's lazy grammars). Two ways in:

    - *tagged*: a token of ``triggers`` anywhere in free text hands over to ``tagged`` (fed from the trigger
      included, so it must allow the trigger first): Qwen's ``<tool_call>``;
    - *leading*: a call that opens the reply without a marker (Llama 3's; Qwen2.5-Coder's bare JSON). While the
      reply so far is a prefix that ``leading`` accepts, every token is still free and ``leading`` follows along;
      once ``commits(tokens)`` says the call is recognised (its name is written, say), the mask is ``leading``'s
      from there on; a token ``leading`` refuses before that makes the reply text (free for good, the tagged
      trigger aside). ``openers`` are tokens the reply may start with before the call (``<|python_tag|>``).

    Every mask is a function of the tokens so far, so the rule's proof holds as for any other constraint; free
    positions get :func:`everything`, which costs nothing.

    Example (tagged): with ``triggers={7}`` and an automaton that allows 7 then 3 then only 0, the tokens 1 1 7 3 0
    are free, free, then the automaton's; rolling back past the 7 frees the mask again.
    """

    # What each consumed token did (the log, one entry a token; rollback undoes entries):
    # "skip" an opener, "lead" followed by `leading` (not yet recognised), "commit" the token that made the call
    # recognised, "call" inside a recognised leading call, "text" the token that made the reply text, "free",
    # "tagged" inside a tagged call (its trigger included).
    AFTER = {"skip": "lead", "lead": "lead", "commit": "call", "call": "call", "text": "free", "free": "free",
             "tagged": "tagged"}

    def __init__(self, vocab_size: int, tagged: Constraint | None = None, triggers=(),
                 leading: Constraint | None = None, commits=None, openers=()) -> None:
        self.vocab_size = int(vocab_size)
        self.tagged, self.leading = tagged, leading
        self.triggers = frozenset(int(t) for t in triggers)
        self.openers = frozenset(int(t) for t in openers)
        if (tagged is None) != (not self.triggers):
            raise ValueError("a tagged call needs both its constraint and at least one trigger token")
        if (leading is None) != (commits is None):
            raise ValueError("a leading call needs both its constraint and commits (when it is recognised)")
        if tagged is None and leading is None:
            raise ValueError("a lazy constraint needs a tagged or a leading call")
        for inner in (tagged, leading):
            if inner is not None and inner.vocab_size != self.vocab_size:
                raise ValueError(f"the inner constraint's vocabulary has {inner.vocab_size} tokens, not "
                                 f"{self.vocab_size}")
        self.commits = commits
        self.log: list[str] = []
        self.lead_tokens: list[int] = []  # the tokens `leading` has consumed (the call's, so far)

    @property
    def phase(self) -> str:
        """``lead`` (a leading call may still come; free), ``call`` (a recognised leading call), ``free``,
        ``tagged``."""
        if not self.log:
            return "lead" if self.leading is not None else "free"
        return self.AFTER[self.log[-1]]

    @property
    def active(self) -> bool:
        """A call has been recognised: its constraint's mask is on."""
        return self.phase in ("call", "tagged")

    def allowed(self) -> torch.Tensor:  # → [vocab] bool
        phase = self.phase
        if phase == "call":
            return self.leading.allowed()
        if phase == "tagged":
            return self.tagged.allowed()
        return everything(self.vocab_size)

    def consume(self, tokens: Sequence[int]) -> None:
        for token in (int(t) for t in tokens):
            phase = self.phase
            if phase in ("lead", "free") and token in self.triggers:
                self.tagged.consume([token])
                self.log.append("tagged")
            elif phase == "tagged":
                self.tagged.consume([token])
                self.log.append("tagged")
            elif phase == "call":
                self.leading.consume([token])
                self.lead_tokens.append(token)
                self.log.append("call")
            elif phase == "lead" and token in self.openers and all(e == "skip" for e in self.log):
                self.log.append("skip")
            elif phase == "lead" and bool(self.leading.allowed()[token]):  # a few tokens at most: then decided
                self.leading.consume([token])
                self.lead_tokens.append(token)
                self.log.append("commit" if self.commits(self.lead_tokens) else "lead")
            else:
                self.log.append("text" if phase == "lead" else "free")

    def rollback(self, n: int) -> None:
        if not 0 <= n <= len(self.log):
            raise ValueError(f"cannot roll back {n} tokens: {len(self.log)} were consumed")
        for _ in range(n):
            entry = self.log.pop()
            if entry in ("lead", "commit", "call"):
                self.leading.rollback(1)
                self.lead_tokens.pop()
            elif entry == "tagged":
                self.tagged.rollback(1)

    def forced(self) -> list[int]:
        phase = self.phase
        if phase == "call":
            return self.leading.forced()
        if phase == "tagged":
            return self.tagged.forced()
        return []
