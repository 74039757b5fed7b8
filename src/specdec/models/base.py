"""The LanguageModel protocol every backend implements, the optional abilities it declares, and shared checks.

A model keeps its own cache of the tokens it has seen. Three verbs are all the decode loops use:

- ``prefill(tokens)``: forget everything, then read ``tokens`` (possibly none) into the cache; returns how
  many of them came from a prefix cache instead of being read (0 for a model without one);
- ``score(tokens)``: append k tokens in one call and return k rows of next-token logits,
  row j being the logits after ``tokens[j]`` (``[k, vocab]``);
- ``trim(length)``: roll the cache back to its first ``length`` tokens (mlx-lm's ``trim``).

Logits (not probabilities) come back so that one sampling transform (``specdec.sampling``) turns
target and draft outputs into p and q the same way. A zero-probability token is ``-inf``.

Beyond the three verbs a backend may offer more, and says so in its ``abilities`` (:class:`Abilities`): the
server's engine reads that value, never probes for methods. Each ability is a Protocol below, which a backend
that declares it implements (``tests/test_abilities.py`` holds every backend to its word):

- :class:`SwitchesState` (``switch_state``): ``state()`` / ``restore(state)``, one model holding several
  sequences, one current at a time (the engine serves several requests on one model);
- :class:`ScoresMany` (``score_many``): several sequences' rows in one call (one read of the weights);
  ``batch_scores`` says whether the engine should use it on this device (transformers only on a GPU: its
  padding changes the last bits of a row on the CPU, where requests keep taking turns);
- :class:`ReadsPrefix` (``read_prefix``): ``prefill`` in three verbs (``reuse_prefix``, ``read``,
  ``keep_prefix``) over a shared ``prefix_cache``, so a long prompt can be read a chunk at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ..checks import check_int


@dataclass(frozen=True)
class Abilities:
    """What a model offers beyond the three verbs (see the module's text); a backend states its own."""

    switch_state: bool = False  # state() / restore(state): several sequences on one model (SwitchesState)
    score_many: bool = False  # several sequences' rows in one call (ScoresMany)
    batch_scores: bool = False  # use score_many here (its rows are bit for bit each alone's, or a GPU wants it)
    read_prefix: bool = False  # reuse_prefix / read / keep_prefix over prefix_cache (ReadsPrefix)

    def __post_init__(self) -> None:
        if self.score_many and not self.switch_state:
            raise ValueError("Abilities: score_many takes and returns sequence states, so it needs switch_state")
        if self.batch_scores and not self.score_many:
            raise ValueError("Abilities: batch_scores prefers score_many, so it needs score_many")


NO_ABILITIES = Abilities()


@runtime_checkable
class LanguageModel(Protocol):
    vocab_size: int
    max_length: int | None  # the context window in tokens; None = unbounded
    device: torch.device
    abilities: Abilities

    @property
    def length(self) -> int:
        """Tokens currently in the cache."""
        ...

    def prefill(self, tokens: Sequence[int]) -> int:  # → tokens taken from a prefix cache (0: all read)
        ...

    def score(self, tokens: Sequence[int]) -> torch.Tensor:  # → [len(tokens), vocab] logits
        ...

    def trim(self, length: int) -> None: ...


@runtime_checkable
class SwitchesState(Protocol):
    """``switch_state``: a sequence's state (its KV cache and length) out and back in."""

    def state(self) -> object: ...

    def restore(self, state: object) -> None: ...


@runtime_checkable
class ScoresMany(SwitchesState, Protocol):
    """``score_many``: ``states[s]`` as ``state()`` gives it, ``tokens[s]`` its k_s appended tokens → each
    sequence's ``[k_s, vocab]`` logits and its new state, bit for bit ``restore(states[s])``, ``score(tokens[s])``
    (to 1e-9 for a padded GPU pass); the model's own current state is left as it was."""

    def score_many(self, states: list, tokens: list[list[int]]) -> tuple[list[torch.Tensor], list]: ...


@runtime_checkable
class ReadsPrefix(Protocol):
    """``read_prefix``: ``prefill`` as three verbs over a shared prefix cache (``models.prefix``)."""

    prefix_cache: object  # a models.prefix.PrefixCache, or None (off)
    last_reused: int  # prompt tokens the last reuse_prefix took from the cache

    def reuse_prefix(self, tokens: Sequence[int]) -> int:
        """Start a new sequence with the longest cached prefix of ``tokens``; its length."""
        ...

    def read(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` as prompt (no logits)."""
        ...

    def keep_prefix(self, tokens: Sequence[int]) -> None:
        """Give the prefix cache the rows of ``tokens``, the prompt just read."""
        ...


ABILITY_PROTOCOLS = {"switch_state": SwitchesState, "score_many": ScoresMany, "read_prefix": ReadsPrefix}


def check_prompt(model: LanguageModel, prompt: Sequence[int], max_new_tokens: int, role: str = "model") -> list[int]:
    """Validate a prompt against a model before any work is done; return it as a list of ints."""
    tokens = [int(t) for t in prompt]
    if not tokens:
        raise ValueError("prompt is empty: give at least 1 token")
    bad = next((t for t in tokens if not 0 <= t < model.vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt token {bad} is outside the {role}'s vocabulary: "
                         f"ids must be in [0, {model.vocab_size - 1}]")
    check_int("max_new_tokens", max_new_tokens)
    limit = model.max_length
    if limit is not None and len(tokens) + max_new_tokens > limit:
        raise ValueError(
            f"prompt of {len(tokens)} tokens + max_new_tokens={max_new_tokens} exceeds the {role}'s "
            f"context of {limit} tokens: prompt length + max_new_tokens must be <= {limit}"
        )
    return tokens


def check_trim(model: LanguageModel, length: int) -> None:
    if not 0 <= length <= model.length:
        raise ValueError(f"cannot trim to {length} tokens: the cache holds {model.length}, "
                         f"length must be in [0, {model.length}]")


def token_strings(model) -> dict[int, object] | None:
    """id → the token's text as the model's tokenizer stores it (bytes for llama.cpp, str for
    transformers), or None when the model has no vocabulary to compare (toy models)."""
    if callable(getattr(model, "token_text", None)):
        return {i: model.token_text(i) for i in range(model.vocab_size)}
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None and callable(getattr(tokenizer, "get_vocab", None)):
        return {i: s for s, i in tokenizer.get_vocab().items()}
    return None


def check_same_vocabulary(target, draft) -> None:
    """The one vocabulary check: refuse a draft whose token ids mean other strings than the target's.

    The models must score the same number of ids; wherever the draft has a token its text must be
    the target's; and the special tokens (when both have a transformers tokenizer) must agree.
    The first difference is named.
    """
    if target.vocab_size != draft.vocab_size:
        raise ValueError(
            f"target and draft vocabularies differ: target scores {target.vocab_size} token ids, "
            f"draft {draft.vocab_size}; they must be equal (the same tokenizer)"
        )
    stored = [m.vocabulary() if callable(getattr(m, "vocabulary", None)) else None for m in (target, draft)]
    same_files = stored[0] is not None and stored[0] == stored[1]  # two GGUF files' lists alike: no id by id
    t_by_id, d_by_id = (None, None) if same_files else (token_strings(target), token_strings(draft))
    for i in sorted(d_by_id) if t_by_id is not None and d_by_id is not None else []:
        if t_by_id.get(i) != d_by_id[i]:
            raise ValueError(
                f"target and draft tokenizers differ at id {i}: target {t_by_id.get(i)!r}, draft "
                f"{d_by_id[i]!r}; speculative decoding needs one shared vocabulary"
            )
    t_tok, d_tok = getattr(target, "tokenizer", None), getattr(draft, "tokenizer", None)
    if t_tok is None or d_tok is None:
        return
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        t_val, d_val = getattr(t_tok, name, None), getattr(d_tok, name, None)
        if t_val != d_val:
            raise ValueError(f"target and draft special tokens differ: {name} is {t_val!r} in the target, "
                             f"{d_val!r} in the draft")
