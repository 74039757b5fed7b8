"""Reading JSON as it streams, for the tool-call parser (``tool_parser``): where a call's head ends, where a JSON
object ends, a call written as one JSON object.

Terms: a call's *head* is its JSON up to the arguments' ``{`` (``{"name": "f", "arguments": {``); a function
that cannot decide yet from the text so far answers ``NEED`` (more must come), one that can answers the result or
``NO``. Nothing here depends on where the text was cut.
"""

from __future__ import annotations

import json

WS = " \t\n\r"  # JSON whitespace
ARG_KEYS = ("arguments", "parameters")  # the key a call's arguments are under (Hermes, Llama)


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
