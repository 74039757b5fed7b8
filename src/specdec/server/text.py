"""Text in and out of a request: prompts to token ids, new token ids to text deltas with stop strings.

Terms:

- *chat prompt*: the messages through the pair's chat template (a pair without one, such as the
  toy pair, gets the contents joined by newlines); *raw prompt*: the text as it is, or token ids.
- a *delta* is the text a stream sends after a round: what is new since the last delta, minus a
  tail that might still become a stop string (or half of a multi-byte character), held back until
  the next round shows it is not.
- a *stop string* ends generation where it first appears; it and everything after it are cut.
  The *tokens of the returned text* are then the fewest leading generated tokens whose decoded
  text covers it (``usage.completion_tokens``): a round that drafted past the stop string does
  not count the tokens it threw away, so the count does not depend on γ.
- in a chat prompt, message contents are text: special-token text typed in them is not parsed as
  a role marker (``specdec.loading.chat``); the template renders a request's tools too, and special-token
  text in them (or in the history's tool calls) is refused.
- the *tool format* of the pair's template (``specdec.server.tools``: Qwen's ``<tool_call>``, Llama 3's JSON,
  or none and why) is found once, the first time a request sends tools.

The tokenizer is shared by the request handlers and the generation thread, so every use of it goes
through one lock (:class:`Texts`).
"""

from __future__ import annotations

import functools
import threading

from ..loading.chat import chat_prompt_ids, special_strings
from .tools import tool_format_of


class Texts:
    """The pair's encode / decode behind one lock, and the chat template for whole conversations."""

    def __init__(self, pair) -> None:
        self.pair = pair
        self.lock = threading.Lock()

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.pair, "has_chat_template", False))

    def chat_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        with self.lock:
            if not self.has_chat_template:
                return self.pair.encode("\n".join(m["content"] for m in messages), chat=False)
            return chat_prompt_ids(self.pair.tokenizer, messages, tools=tools)

    @functools.cached_property
    def tool_format(self):
        """(the template's ``tools.ToolFormat``, "") or (None, why it has none)."""
        if not self.has_chat_template:
            return None, "it has no chat template"
        with self.lock:
            return tool_format_of(self.pair.tokenizer)

    @functools.cached_property
    def specials(self) -> list[str]:
        """The text of the tokenizer's special tokens (none without a tokenizer)."""
        tokenizer = getattr(self.pair, "tokenizer", None)
        return special_strings(tokenizer) if tokenizer is not None else []

    def raw_ids(self, prompt: str) -> list[int]:
        with self.lock:
            return self.pair.encode(prompt, chat=False)

    def decode(self, ids: list[int]) -> str:
        with self.lock:
            return self.pair.decode(ids)


class TextTracker:
    """One request's output text: ``update(ids)`` after each round → (delta, stopped)."""

    def __init__(self, texts: Texts, stops: list[str]) -> None:
        self.texts, self.stops = texts, [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.sent = ""  # the text streamed so far
        self.text = ""  # the whole text once finished (cut at a stop string)
        self.tokens = 0  # how many generated tokens the text returned so far takes (see the module docstring)

    def update(self, ids: list[int], final: bool = False) -> tuple[str, bool]:
        """The new text ready to send for all ``ids`` generated so far, and whether a stop string
        appeared (then the text ends before it). ``final``: nothing more comes, send all of it."""
        text = self.texts.decode(ids)
        cut = first_stop(text, self.stops)
        self.tokens = len(ids)
        if cut is not None:
            self.tokens = tokens_covering(self.texts, ids, text[:cut])
            return self._send(text[:cut], True), True
        if final:
            return self._send(text, True), False
        end = len(text) - self.hold
        while end > 0 and text[end - 1] == "\ufffd":  # half of a multi-byte character: wait for the rest
            end -= 1
        return self._send(text[:max(end, len(self.sent))], False), False

    def _send(self, upto: str, final: bool) -> str:
        delta = upto[len(self.sent):] if upto.startswith(self.sent) else ""
        self.sent = upto if len(upto) >= len(self.sent) else self.sent
        if final:
            self.text = self.sent
        return delta


def tokens_covering(texts: Texts, ids: list[int], text: str) -> int:
    """The fewest leading ``ids`` whose decoded text starts with ``text`` (a prefix of ``decode(ids)``).

    Found by bisection: a longer prefix of the ids decodes to a longer text, so "covers" holds from
    some count on. With the toy pair's words, ids ``the cat sat on`` and text ``"the cat sat "``:
    3 tokens give "the cat sat", which misses the space; 4 are needed.
    """
    low, high = 0, len(ids)  # covers(high) holds: text is a prefix of decode(ids)
    while low < high:
        mid = (low + high) // 2
        if texts.decode(ids[:mid]).startswith(text):
            high = mid
        else:
            low = mid + 1
    return high


def first_stop(text: str, stops: list[str]) -> int | None:
    """Where the earliest stop string starts in ``text``, or None.

    >>> first_stop("a cat sat on the mat", ["mat", "sat"])
    6
    """
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None
