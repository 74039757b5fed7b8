"""Text in and out of a request: prompts to token ids, new token ids to text deltas with stop strings.

Terms:

- *chat prompt*: the messages through the pair's chat template (a pair without one, such as the
  toy pair, gets the contents joined by newlines); *raw prompt*: the text as it is, or token ids.
- a *delta* is the text a stream sends after a round: what is new since the last delta, minus a
  tail that might still become a stop string (or half of a multi-byte character), held back until
  the next round shows it is not.
- a *stop string* ends generation where it first appears; it and everything after it are cut.

The tokenizer is shared by the request handlers and the generation thread, so every use of it goes
through one lock (:class:`Texts`).
"""

from __future__ import annotations

import threading


class Texts:
    """The pair's encode / decode behind one lock, and the chat template for whole conversations."""

    def __init__(self, pair) -> None:
        self.pair = pair
        self.lock = threading.Lock()

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.pair, "has_chat_template", False))

    def chat_ids(self, messages: list[dict]) -> list[int]:
        with self.lock:
            if not self.has_chat_template:
                return self.pair.encode("\n".join(m["content"] for m in messages), chat=False)
            tokenizer = self.pair.tokenizer
            rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])

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

    def update(self, ids: list[int], final: bool = False) -> tuple[str, bool]:
        """The new text ready to send for all ``ids`` generated so far, and whether a stop string
        appeared (then the text ends before it). ``final``: nothing more comes, send all of it."""
        text = self.texts.decode(ids)
        cut = first_stop(text, self.stops)
        if cut is not None:
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


def first_stop(text: str, stops: list[str]) -> int | None:
    """Where the earliest stop string starts in ``text``, or None.

    >>> first_stop("a cat sat on the mat", ["mat", "sat"])
    6
    """
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None
