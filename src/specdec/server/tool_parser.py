"""The model's tool calls read out of its reply as it streams: an incremental parser fed the text deltas.

Terms:

- a *style* is how a model writes its calls (``specdec.server.tools`` names each model family's): ``tagged``,
  each call between a *marker* and an *end* anywhere in the reply (Qwen2.5's and Qwen3's Hermes format:
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``); ``leading``, JSON objects at the start of the
  reply, optionally after ``<|python_tag|>``, several separated by ``;`` (Llama 3.x: ``{"name": ..., "parameters":
  {...}}``);
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

import json
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass

WS = " \t\n\r"  # JSON whitespace
PYTHON_TAG = "<|python_tag|>"
ARG_KEYS = ("arguments", "parameters")  # the key a call's arguments are under (Hermes, Llama)


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


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WS:
        i += 1
    return i


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``marker`` (what to hold back)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


NEED = "need"  # match_head: the text so far is the start of a head, more must come
NO = "no"  # match_head: the text is no head


def match_head(text: str) -> tuple[str, int] | str:
    """``{"name": "<name>", "<arguments|parameters>": {`` at the start of ``text``, JSON whitespace between
    the parts: (name, index of the arguments' ``{``), or NEED, or NO."""
    i, name = 0, None
    for part in ("{", '"name"', ":", "STRING", ",", '"arguments"|"parameters"', ":", "{"):
        i = skip_ws(text, i)
        if i == len(text):
            return NEED
        if part == "STRING":
            end = string_end(text, i)
            if end is None or end == NEED:
                return NO if end is None else NEED
            try:
                name = json.loads(text[i:end])
            except ValueError:
                return NO
            i = end
            continue
        options = part.split("|")
        hit = next((o for o in options if text.startswith(o, i)), None)
        if hit is None:
            return NEED if any(o.startswith(text[i:]) for o in options) else NO
        i += len(hit)
    return name, i - 1


def string_end(text: str, i: int) -> int | str | None:
    """The index after the JSON string starting at ``text[i]``; NEED if it does not end in ``text``; None if
    ``text[i]`` opens no string."""
    if text[i] != '"':
        return None
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == '"':
            return j + 1
        j += 1
    return NEED


class ValueScanner:
    """Where a JSON object or array ends: depth and string state over the characters fed to it. ``depth``
    starts above 0 to find the end of an enclosing object instead. A ``<`` outside a string (no JSON has one:
    the start of an end marker) ends the value there, unfinished."""

    def __init__(self, depth: int = 0) -> None:
        self.depth, self.in_string, self.escape, self.done = depth, False, False, False

    def feed(self, text: str) -> int:
        """How many characters of ``text`` belong to the value; ``done`` once it ended."""
        for k, ch in enumerate(text):
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth <= 0:
                    self.done = True
                    return k + 1
            elif ch == "<":
                self.done = True
                return k
        return len(text)


def call_of_json(text: str) -> tuple[str, str] | None:
    """(name, arguments as a JSON string) of a call written as a JSON object in any key order, else None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = next((value[k] for k in ARG_KEYS if k in value), None)
    if isinstance(args, str):
        return value["name"], args
    return (value["name"], json.dumps(args, ensure_ascii=False)) if isinstance(args, dict) else None


class CallParser:
    """Feed it the reply's text deltas (``feed``), then ``close()``; each returns the new events."""

    def __init__(self, style: str, marker: str = "", end: str = "", names: Collection[str] | None = None,
                 max_calls: int | None = None, new_id: Callable[[], str] = new_call_id) -> None:
        if style not in ("tagged", "leading"):
            raise ValueError(f"style={style!r} is invalid: 'tagged' or 'leading'")
        self.style, self.marker, self.end = style, marker, end
        self.names = None if names is None else set(names)
        self.max_calls, self.new_id = max_calls, new_id
        self.buf, self.state = "", "out" if style == "tagged" else "start"
        self.events: list = []
        self.ws_hold = ""  # trailing whitespace of the content so far, sent once text follows it
        self.pre_ws = ""  # the whitespace held before the call being read (given back if it is content)
        self.raw = ""  # the text of the call being read before its head (given back if it is content)
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

    def _out(self, final: bool) -> bool:  # tagged: content until a marker
        k = self.buf.find(self.marker)
        if k >= 0:
            self._content(self.buf[:k])
            self.pre_ws, self.ws_hold, self.raw = self.ws_hold, "", self.marker
            self.buf, self.state = self.buf[k + len(self.marker):], "head"
            return True
        keep = 0 if final else partial_suffix(self.buf, self.marker)
        self._content(self.buf[:len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep:]
        return False

    def _start(self, final: bool) -> bool:  # leading: is the reply (or what follows a ';') a JSON object?
        i = skip_ws(self.buf, 0)
        if self.buf.startswith(PYTHON_TAG, i):
            i = skip_ws(self.buf, i + len(PYTHON_TAG))
        elif PYTHON_TAG.startswith(self.buf[i:]) and not final:
            return False  # the tag, or whitespace, so far
        if i == len(self.buf):
            if final:
                self.state = "plain"
                return True
            return False
        if self.buf[i] != "{":
            self.state = "plain"
            return True
        self.raw, self.pre_ws = self.buf[:i], ""
        self.buf, self.state = self.buf[i:], "head"
        return True

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
        if self.style == "leading":
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

    def _raw(self, final: bool) -> bool:  # a call not read by its head: read it whole when it ends
        if self.style == "tagged":
            k = self.buf.find(self.end)
            if k < 0 and not final:
                return False
            body, closed = (self.buf[:k], True) if k >= 0 else (self.buf, False)
            self.buf = self.buf[k + len(self.end):] if closed else ""
            text = self.raw + body + (self.end if closed else "")
        else:
            scanner = ValueScanner()
            n = scanner.feed(self.buf)
            if not scanner.done and not final:
                return False
            body, self.buf = self.buf[:n], self.buf[n:]
            text = self.raw + body
        call = call_of_json(body.strip(WS))
        if call is not None and (self.names is None or call[0] in self.names):
            self._start_call(call[0])
            self._send(CallArgs(self.calls, call[1]))
            self._end_call()
        elif self.style == "tagged":
            self.ws_hold = self.pre_ws
            self._content(text)
            self.state = "out"
        else:
            self.buf, self.state = text + self.buf, "plain"
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
                self.buf, self.state = self.buf[j:], "head"
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
        self.state = "out" if self.style == "tagged" else "between"

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
