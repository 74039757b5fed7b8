"""Grammars over a real tokenizer, by llguidance: JSON schemas, JSON objects, Lark grammars, regular expressions.

:class:`Grammar` is a ``specdec.constraint.Constraint`` (one sequence's matcher): its ``allowed()`` mask comes from
llguidance's token bitmask (``LLMatcher.compute_bitmask``, padded with False to the model's vocabulary), its
``forced()`` tokens from the fast-forward tokens the grammar fixes (JSON keys, braces, a tool's name), and
``rollback`` is llguidance's own. Once the grammar is complete only the end-of-generation tokens are allowed,
so a constrained answer ends where its grammar does.

Terms: a *grammar text* is what llguidance compiles (its Lark dialect, or the JSON form its ``grammar_from_*``
functions give): :func:`json_schema_grammar`, :func:`json_object_grammar`, :func:`lark_grammar`. It is plain
data (a string), so settings carry it (``session.RunSettings.grammar``) and each run builds its own matcher
(:func:`grammar_for`). A text that does not compile, or that goes past :data:`LIMITS` (a huge or deeply nested
schema from a client), is a :class:`GrammarError` naming llguidance's reason: refused before any model call.

A :class:`LazyGrammar` is a grammar that starts at a trigger (llama.cpp's lazy grammars; tool calls under
``tool_choice`` ``auto``): the reply is free text until the trigger token, then follows its grammar from the
trigger on (``constraint.Lazy``), so free text costs no mask and a call still matches its schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from .json_values import unending_reference

MAX_GRAMMAR_BYTES = 256_000  # a grammar text (a schema, a tool list) larger than this is refused
# JSON's layout: one space after ':' and ',' and no other whitespace (Python's json.dumps, the layout models
# write): the grammar then fixes every key, brace and separator, which are forced drafts (no draft call).
# A schema's own "x-guidance" options override it.
JSON_LAYOUT = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


class GrammarError(ValueError):
    """A grammar, schema or regular expression that cannot be compiled (or is too large): the reason."""


def _llguidance():
    try:
        import llguidance
    except ImportError as err:  # a dependency of specdec: only a broken install lacks it
        raise GrammarError("constrained decoding needs the llguidance package (pip install llguidance)") from err
    return llguidance


def limits():
    """llguidance's parser limits for one grammar: its defaults, with the grammar's size and the work of one mask
    step bounded (a hostile schema is an error, never a hang)."""
    llg = _llguidance()
    return llg.LLParserLimits(max_grammar_size=200_000, step_max_items=50_000, max_lexer_states=100_000)


def json_schema_grammar(schema: dict | str) -> str:
    """The grammar text of JSON values matching ``schema`` (a dict or its JSON text)."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    if len(text) > MAX_GRAMMAR_BYTES:
        raise GrammarError(f"the JSON schema is {len(text)} bytes: at most {MAX_GRAMMAR_BYTES} are accepted")
    if isinstance(schema, str):
        try:
            schema = json.loads(text)
        except ValueError:
            schema = None  # not JSON: llguidance says so below
    check_ends(schema)
    try:
        return _llguidance().LLMatcher.grammar_from_json_schema(text, defaults=JSON_LAYOUT)
    except ValueError as err:
        raise GrammarError(f"the JSON schema is invalid: {err}") from err


def check_ends(schema, what: str = "the JSON schema") -> None:
    """A GrammarError when ``schema`` has a reference loop with no way out (``specdec.json_values``): llguidance
    compiles those, and generation would dead-end inside the loop."""
    try:
        ref = unending_reference(schema)
    except ValueError as err:
        raise GrammarError(f"{what}: {err}") from None
    if ref is not None:
        raise GrammarError(f"{what} allows no value: its reference {ref!r} can only lead back to itself "
                           "(a loop of references with no way out)")


def json_object_grammar() -> str:
    """Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)."""
    return json_schema_grammar({"type": "object"})


def lark_grammar(text: str) -> str:
    """A grammar in llguidance's Lark dialect, checked for size (compiled when a matcher is built)."""
    if len(text) > MAX_GRAMMAR_BYTES:
        raise GrammarError(f"the grammar is {len(text)} bytes: at most {MAX_GRAMMAR_BYTES} are accepted")
    return _llguidance().LLMatcher.grammar_from_lark(text)


@lru_cache(maxsize=8)
def _tokenizer(hf_tokenizer, vocab_size: int, eos: tuple[int, ...]):
    """llguidance's view of a Hugging Face fast tokenizer (about 2 s to build for a 150k vocabulary: kept)."""
    import llguidance.hf

    return llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=list(eos))


class Grammar:
    """One sequence's matcher of ``grammar`` (a grammar text) over ``hf_tokenizer``'s tokens; ``vocab_size`` is
    the model's (ids past the tokenizer's are never allowed); ``eos`` the ids that end a generation."""

    def __init__(self, grammar: str, hf_tokenizer, vocab_size: int, eos: Sequence[int]) -> None:
        llg = _llguidance()
        if hf_tokenizer is None:
            raise GrammarError("constrained decoding needs the model's tokenizer, and this pair has none")
        try:
            self._tokens = _tokenizer(hf_tokenizer, int(vocab_size), tuple(int(t) for t in eos))
        except ValueError as err:
            raise GrammarError(f"llguidance cannot read this tokenizer: {err}") from err
        self.matcher = llg.LLMatcher(self._tokens, grammar, log_level=0, limits=limits())
        if self.matcher.is_error():
            raise GrammarError(f"the grammar does not compile: {self.matcher.get_error()}")
        self.vocab_size = int(vocab_size)
        self._eos = frozenset(int(t) for t in eos)
        self._past_stop = 0  # end-of-generation tokens consumed after the grammar stopped (llguidance refuses them)
        self._words = (self._tokens.vocab_size + 31) // 32
        self._bitmask = np.full((1, self._words), -1, dtype=np.int32)
        self._check_it_can_start()

    def _check_it_can_start(self) -> None:
        """A grammar that compiles may still allow no text at all (a JSON schema whose only definition refers to
        itself): found here, where the request is checked (a 400), not at its first token (a failed generation)."""
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self.matcher, self._bitmask)
        if self.matcher.is_error():
            reason = (self.matcher.get_error() or "").splitlines()
            raise GrammarError(f"the grammar allows no text: {reason[0] if reason else 'no token can start it'}")

    def allowed(self) -> torch.Tensor:  # → [vocab] bool
        from llguidance.numpy import fill_next_token_bitmask

        if self._past_stop:  # after the end of generation (a draft past it): only the end again
            mask = torch.zeros(self.vocab_size, dtype=torch.bool)
            mask[sorted(self._eos)] = True
            return mask
        fill_next_token_bitmask(self.matcher, self._bitmask)
        self._check()
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")
        mask = np.zeros(self.vocab_size, dtype=bool)
        n = min(self.vocab_size, bits.size)
        mask[:n] = bits[:n]
        return torch.from_numpy(mask)

    def consume(self, tokens: Sequence[int]) -> None:
        for token in (int(t) for t in tokens):
            if token in self._eos and (self._past_stop or self.matcher.is_stopped()):
                self._past_stop += 1  # the end of a complete sentence: allowed, and nothing follows
            elif not self.matcher.consume_token(token):
                raise ValueError(f"token {token} is not allowed by the grammar here: {self.matcher.get_error()}")

    def rollback(self, n: int) -> None:
        past = min(n, self._past_stop)
        self._past_stop -= past
        n -= past
        if n and not self.matcher.rollback(n):
            raise ValueError(f"cannot roll the grammar back {n} tokens: {self.matcher.get_error()}")

    def forced(self) -> list[int]:
        if self._past_stop:
            return []
        forced = self.matcher.compute_ff_tokens()
        self._check()
        return [int(t) for t in forced]

    @property
    def complete(self) -> bool:
        """The tokens so far are a whole sentence of the grammar."""
        return bool(self.matcher.is_accepting())

    def _check(self) -> None:
        if self.matcher.is_error():
            raise GrammarError(f"the grammar failed: {self.matcher.get_error()}")


@dataclass(frozen=True)
class LazyGrammar:
    """Free text, with a call constrained from where it is recognised (``constraint.Lazy``); grammar texts all.

    ``tagged`` with ``trigger`` (a special token's text, e.g. ``<tool_call>``): from the trigger's first occurrence
    anywhere in the reply on, the reply follows ``tagged`` (whose first token is the trigger). ``leading`` with
    ``commit`` (a regular expression): a call that opens the reply (after any of ``openers``, token texts such as
    ``<|python_tag|>``) is recognised once the reply's text so far matches ``commit`` from its start (the call's
    name written), and then follows ``leading`` (which has followed it from the start). ``whole`` is the grammar
    of the whole reply, what runs instead when the trigger is not one token of the tokenizer."""

    whole: str
    tagged: str | None = None
    trigger: str | None = None
    leading: str | None = None
    commit: str | None = None
    openers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.tagged is None) != (self.trigger is None) or (self.leading is None) != (self.commit is None):
            raise ValueError("a LazyGrammar's tagged call needs its trigger, and its leading call its commit pattern")
        if self.tagged is None and self.leading is None:
            raise ValueError("a LazyGrammar needs a tagged or a leading call")


def trigger_id(tokenizer, text: str) -> int | None:
    """The id of ``text`` when the tokenizer reads it as one token, else None."""
    try:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    except Exception:
        return None
    return int(ids[0]) if len(ids) == 1 else None


def grammar_for(grammar: str | LazyGrammar | None, pair):
    """A fresh matcher of ``grammar`` for one run on ``pair`` (its tokenizer, the target's vocabulary, the pair's
    end-of-generation ids): a :class:`Grammar`, a ``constraint.Lazy`` for a :class:`LazyGrammar`; None without."""
    if grammar is None:
        return None
    tokenizer = getattr(pair, "tokenizer", None)

    def matcher(text: str) -> Grammar:
        return Grammar(text, tokenizer, pair.target.vocab_size, pair.eos_token_ids)

    if isinstance(grammar, str):
        return matcher(grammar)
    from .constraint import Lazy

    tagged = triggers = None
    if grammar.tagged is not None:
        token = trigger_id(tokenizer, grammar.trigger) if tokenizer is not None else None
        if token is None:
            return matcher(grammar.whole)
        tagged, triggers = matcher(grammar.tagged), [token]
    leading = commits = None
    if grammar.leading is not None:
        leading, commits = matcher(grammar.leading), TextMatch(grammar.commit, tokenizer)
    openers = [t for t in (trigger_id(tokenizer, o) for o in grammar.openers) if t is not None] if tokenizer else []
    return Lazy(pair.target.vocab_size, tagged, triggers or (), leading, commits, openers)


class TextMatch:
    """Whether tokens' text matches ``pattern`` from its start (a leading call recognised)."""

    def __init__(self, pattern: str, tokenizer) -> None:
        self.pattern, self.tokenizer = re.compile(pattern), tokenizer

    def __call__(self, tokens: list[int]) -> bool:
        return self.pattern.match(self.tokenizer.decode(tokens)) is not None
