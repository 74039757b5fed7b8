"""The model's tool calls read out of its reply as it streams: an incremental parser fed the text deltas.

Terms:

- a *style* is how a model writes its calls (``specdec.server.tools`` names each model family's): ``tagged``,
  each call between a *marker* and an *end* anywhere in the reply (Qwen2.5's and Qwen3's Hermes format:
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``); ``leading``, JSON objects at the start of the
  reply, optionally after ``<|python_tag|>``, several separated by ``;`` (Llama 3.x: ``{"name": ..., "parameters":
  {...}}``);
- a *bare call* opens a tagged reply without its marker: a JSON object naming a declared tool, maybe in a
  Markdown code block (the fence dropped). Qwen2.5-Coder writes its calls so when nothing constrains it (as
  llama.cpp's Hermes reader, this one takes it as a call);
- a call's *head* is its JSON up to the arguments' ``{`` (``{"name": "f", "arguments": {``); once the head is
  read the call starts (:class:`CallStart`: its index, id and name), and the arguments' text follows as it comes
  (:class:`CallArgs`), the JSON object exactly as the model wrote it; text outside calls is :class:`Content`;
- a call the parser cannot read as one (a head in another key order, a name no tool has) is held until its end
  and then read as JSON, or else given back as content, as it was written.

Every decision depends on the text only, never on where it was cut: the parser holds back what it cannot decide
yet (half of a marker, a head not yet complete), so the events of any split of a text reassemble to those of the
whole (tested at every character boundary) and :func:`read_calls` is the parser fed the whole text. Whitespace
next to a call (before its marker, after its end, at the end of a reply with calls) is dropped; a reply without
calls is its text as it is.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass

from .json_scan import NEED, NO, WS, ValueScanner, call_of_json, match_head, partial_suffix, skip_ws

PYTHON_TAG = "<|python_tag|>"
FENCES = ("```json", "```")  # a bare call in a Markdown code block (the fence dropped)


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArgs:
    index: int
    text: str


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class CallParser:
    """Feed it the reply's text deltas (``feed``), then ``close()``; each returns the new events."""

    def __init__(self, style: str, marker: str = "", end: str = "", names: Collection[str] | None = None,
                 max_calls: int | None = None, new_id: Callable[[], str] = new_call_id) -> None:
        if style not in ("tagged", "leading"):
            raise ValueError(f"style={style!r} is invalid: 'tagged' or 'leading'")
        self.style, self.marker, self.end = style, marker, end
        self.names = None if names is None else set(names)
        self.max_calls, self.new_id = max_calls, new_id
        # a tagged reply may still open with a bare call (a JSON object naming a declared tool, maybe fenced)
        self.buf, self.state = "", "start" if style == "leading" or self.names is not None else "out"
        self.events: list = []
        self.ws_hold = ""  # trailing whitespace of the content so far, sent once text follows it
        self.pre_ws = ""  # the whitespace held before the call being read (given back if it is content)
        self.raw = ""  # the text of the call being read before its head (given back if it is content)
        self.bare = self.fenced = False  # the call being read has no marker (a JSON object), in a code block
        self.after_call = False  # drop the whitespace that follows a call
        self.calls = 0  # calls read (the ones past max_calls are read, not sent)
        self.scanner = ValueScanner()

    # ------------------------------------------------------------------ the interface

    def feed(self, text: str) -> list:
        self.buf += text
        self._run(final=False)
        return self._take()

    def close(self) -> list:
        self._run(final=True)
        if self.state in ("args", "tail"):
            self._end_call()
        if not self.calls and self.ws_hold:
            self.events.append(Content(self.ws_hold))
        self.ws_hold = ""
        return self._take()

    # ------------------------------------------------------------------ the states

    def _run(self, final: bool) -> None:
        while getattr(self, "_" + self.state)(final):
            pass

    @property
    def _text_state(self) -> str:  # where text that is no call goes
        return "out" if self.style == "tagged" else "plain"

    def _start(self, final: bool) -> bool:  # does the reply open with a bare call (a JSON object)?
        i = skip_ws(self.buf, 0)
        prefixes = (PYTHON_TAG,) if self.style == "leading" else FENCES
        if any(p.startswith(self.buf[i:]) and len(self.buf) - i < len(p) for p in prefixes) and not final:
            return False  # whitespace, or the start of a tag or fence, so far
        hit = next((p for p in prefixes if self.buf.startswith(p, i)), None)  # the longest first
        if hit is not None:
            i = skip_ws(self.buf, i + len(hit))
        if i == len(self.buf) and not final:
            return False
        if i == len(self.buf) or self.buf[i] != "{":
            self.state = self._text_state
            return True
        self.raw, self.pre_ws, self.bare, self.fenced = self.buf[:i], "", True, hit in FENCES
        self.buf, self.state = self.buf[i:], "head"
        return True

    def _out(self, final: bool) -> bool:  # tagged: content until a marker
        k = self.buf.find(self.marker)
        if k >= 0:
            self._content(self.buf[:k])
            self.pre_ws, self.ws_hold, self.raw, self.bare = self.ws_hold, "", self.marker, False
            self.buf, self.state = self.buf[k + len(self.marker):], "head"
            return True
        keep = 0 if final else partial_suffix(self.buf, self.marker)
        self._content(self.buf[:len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep:]
        return False

    def _head(self, final: bool) -> bool:
        head = match_head(self.buf)
        if head == NEED and not final:
            return False
        if head in (NEED, NO) or (self.names is not None and head[0] not in self.names):
            self.state = "raw"
            return True
        name, at = head
        self._start_call(name)
        self.raw, self.buf, self.state, self.scanner = "", self.buf[at:], "args", ValueScanner()
        return True

    def _args(self, final: bool) -> bool:
        n = self.scanner.feed(self.buf)
        self._send(CallArgs(self.calls, self.buf[:n]) if n else None)
        self.buf = self.buf[n:]
        if self.scanner.done:
            self.state, self.scanner = "tail", ValueScanner(depth=1)
            return True
        return False

    def _tail(self, final: bool) -> bool:  # after the arguments: to the end marker, or the object's end
        if self.bare:
            n = self.scanner.feed(self.buf)
            self.buf = self.buf[n:]
            if not self.scanner.done:
                return False
        else:
            k = self.buf.find(self.end)
            if k < 0:
                keep = 0 if final else partial_suffix(self.buf, self.end)
                self.buf = self.buf[len(self.buf) - keep:]
                return False
            self.buf = self.buf[k + len(self.end):]
        self._end_call()
        return True

    def _raw(self, final: bool) -> bool:  # a call not read by its head: read it whole once it ends
        if self.bare:
            scanner = ValueScanner()
            n = scanner.feed(self.buf)
            if not scanner.done and not final:
                return False
            body, self.buf = self.buf[:n], self.buf[n:]
            text = self.raw + body
        else:
            k = self.buf.find(self.end)
            if k < 0 and not final:
                return False
            body, closed = (self.buf[:k], True) if k >= 0 else (self.buf, False)
            self.buf = self.buf[k + len(self.end):] if closed else ""
            text = self.raw + body + (self.end if closed else "")
        call = call_of_json(body.strip(WS))
        if call is not None and (self.names is None or call[0] in self.names):
            self._start_call(call[0])
            self._send(CallArgs(self.calls, call[1]))
            self._end_call()
        elif self.bare:  # no call after all: the text as it was
            self.buf, self.state, self.bare = text + self.buf, self._text_state, False
        else:
            self.ws_hold = self.pre_ws
            self._content(text)
            self.state = "out"
        return True

    def _fence(self, final: bool) -> bool:  # after a bare call in a code block: its closing fence
        i = skip_ws(self.buf, 0)
        if "```".startswith(self.buf[i:]) and not final:
            return False
        if self.buf.startswith("```", i):
            self.buf = self.buf[i + 3:]
        self.state = "out"
        return True

    def _between(self, final: bool) -> bool:  # leading: after a call, ';' and another, or the rest as content
        i = skip_ws(self.buf, 0)
        self.buf = self.buf[i:]  # whitespace after a call is dropped
        if not self.buf:
            return False
        if self.buf[0] == ";":
            j = skip_ws(self.buf, 1)
            if j == len(self.buf) and not final:
                return False
            if j < len(self.buf) and self.buf[j] == "{":
                self.buf, self.state, self.bare = self.buf[j:], "head", True
                return True
        self.state = "plain"
        return True

    def _plain(self, final: bool) -> bool:  # leading: everything else is content
        self._content(self.buf)
        self.buf = ""
        return False

    # ------------------------------------------------------------------ events

    def _start_call(self, name: str) -> None:
        self.pre_ws = ""
        self._send(CallStart(self.calls, self.new_id(), name))

    def _end_call(self) -> None:
        self.calls += 1
        self.after_call, self.raw = True, ""
        if self.style == "leading":
            self.state = "between"
        else:
            self.state = "fence" if self.bare and self.fenced else "out"
        self.bare = self.fenced = False

    def _send(self, event) -> None:
        if event is not None and (self.max_calls is None or self.calls < self.max_calls):
            self.events.append(event)

    def _content(self, text: str) -> None:
        if self.after_call:
            text = text.lstrip(WS)
            if not text:
                return
            self.after_call = False
        text = self.ws_hold + text
        body = text.rstrip(WS)
        self.ws_hold = text[len(body):]
        if body:
            self.events.append(Content(body))

    def _take(self) -> list:
        """The events since the last call, adjacent content and adjacent arguments of one call merged."""
        out: list = []
        for event in self.events:
            last = out[-1] if out else None
            if isinstance(event, Content) and isinstance(last, Content):
                out[-1] = Content(last.text + event.text)
            elif isinstance(event, CallArgs) and isinstance(last, CallArgs) and last.index == event.index:
                out[-1] = CallArgs(event.index, last.text + event.text)
            elif not (isinstance(event, CallArgs) and not event.text):
                out.append(event)
        self.events = []
        return out


def read_calls(parser: CallParser, text: str) -> tuple[str | None, list[dict]]:
    """The whole reply ``text`` → (content, tool calls in the OpenAI shape); content None when the reply is
    only calls."""
    content, calls = [], []
    for event in parser.feed(text) + parser.close():
        if isinstance(event, Content):
            content.append(event.text)
        elif isinstance(event, CallStart):
            calls.append({"id": event.id, "type": "function", "function": {"name": event.name, "arguments": ""}})
        else:
            calls[event.index]["function"]["arguments"] += event.text
    text = "".join(content)
    return (None if calls and not text else text), calls


def openai_deltas(events: list) -> list[dict]:
    """Stream chunks' ``delta`` objects for ``events``: content, a call's first delta (index, id, type, name,
    arguments ""), then its arguments' fragments."""
    out = []
    for event in events:
        if isinstance(event, Content):
            out.append({"content": event.text})
        elif isinstance(event, CallStart):
            out.append({"tool_calls": [{"index": event.index, "id": event.id, "type": "function",
                                        "function": {"name": event.name, "arguments": ""}}]})
        else:
            out.append({"tool_calls": [{"index": event.index, "function": {"arguments": event.text}}]})
    return out
