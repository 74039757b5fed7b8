"""A request's log-probabilities (``logprobs``): which tokens' figures go with which text, and their OpenAI shapes.

Terms: an *entry* is one returned token's figures (:class:`Entry`): its text (the tokenizer's decoding of the one id),
its log-probability under the target's raw distribution (``stats.TokenLogprob``: the log-softmax of the logits,
before temperature, top-k/p, min-p and any grammar mask) and its ``k`` most likely alternatives, and its *offset*
(where its text starts in the returned text: the length of the decoding of the tokens before it, at most the text's
length). A job's :class:`LogprobFeed` takes each round's kept tokens' figures; a token's entry is *ready* once the
text streamed so far holds all of its text (the decoding of the tokens up to it is a prefix of what was sent), so a
stream's chunk carries the entries of the tokens whose text it completes; when the run ends, the rest follow, up to
the tokens of the returned text (``TextTracker.tokens``: a stop string cuts them). An end-of-sequence token is not
in the text and gets no entry. Both the whole answer and the stream are built from the same events, so they carry
the same entries.

Shapes: chat ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}],
"refusal": None}``; completions (legacy) ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}] or None
(k = 0), "text_offset"}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..stats import TokenLogprob


@dataclass(frozen=True)
class Entry:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]
    offset: int


class LogprobFeed:
    """One job's figures, kept tokens in order, and how many of them have gone out as entries."""

    def __init__(self, texts, stop_ids) -> None:
        self.texts, self.stop_ids = texts, set(stop_ids)
        self.figures: list[TokenLogprob] = []
        self.given = 0  # entries handed out so far
        self.offset = 0  # the length of the decoding of the tokens given so far

    def add(self, figures) -> None:
        self.figures.extend(figures)

    def _entry(self, i: int, offset: int) -> Entry:
        lp = self.figures[i]
        decode = self.texts.decode
        return Entry(decode([lp.token]), lp.logprob, tuple((decode([t]), v) for t, v in lp.top), offset)

    def _usable(self, ids: list[int]) -> int:
        """How many leading tokens may have entries: those with figures, an end-of-sequence token left out."""
        n = min(len(ids), len(self.figures))
        while n > self.given and ids[n - 1] in self.stop_ids:
            n -= 1
        return n

    def ready(self, ids: list[int], sent: str) -> tuple[Entry, ...]:
        """The entries of the tokens whose text ``sent`` (the text streamed so far) now holds in full."""
        out, usable = [], self._usable(ids)
        while self.given < usable:
            text = self.texts.decode(ids[: self.given + 1])
            if not sent.startswith(text):
                break
            out.append(self._entry(self.given, self.offset))
            self.given, self.offset = self.given + 1, len(text)
        return tuple(out)

    def rest(self, ids: list[int], tokens: int, text: str) -> tuple[Entry, ...]:
        """At the end: the entries not yet given of the tokens of the returned text (``tokens`` of ``ids``)."""
        out, usable = [], min(self._usable(ids), tokens)
        while self.given < usable:
            out.append(self._entry(self.given, min(self.offset, len(text))))
            self.given += 1
            self.offset = len(self.texts.decode(ids[: self.given]))
        return tuple(out)


def utf8(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="surrogatepass"))


def chat_content(entries) -> list[dict]:
    return [{"token": e.token, "logprob": e.logprob, "bytes": utf8(e.token),
             "top_logprobs": [{"token": t, "logprob": v, "bytes": utf8(t)} for t, v in e.top]} for e in entries]


def chat_logprobs(entries) -> dict:
    return {"content": chat_content(entries), "refusal": None}


def legacy_logprobs(entries, k: int) -> dict:
    """The completions shape (offsets in the whole returned text, in a stream's chunks too)."""
    tops = []
    for e in entries:
        top: dict[str, float] = {}
        for t, v in e.top:
            top.setdefault(t, v)  # two ids of the same text: the likelier one's figure
        tops.append(top)
    return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": tops if k > 0 else None, "text_offset": [e.offset for e in entries]}
